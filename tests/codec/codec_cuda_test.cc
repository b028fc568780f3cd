// The CUDA codec kernels (codec_cuda.h) against the CPU codecs, bit for bit: streams, decoded
// values, accumulated values and error-feedback residuals. Skipped where no CUDA device is
// present; the argument checks, which run on the host before any CUDA call, run everywhere.
#include "collectives/codec/codec_cuda.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"

namespace nanoccl::codec {
namespace {

bool haveDevice() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_DEVICE() \
  if (!haveDevice()) GTEST_SKIP() << "no CUDA device"

uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Like the CPU test's inputs: many binades, and NaN/inf/zero/subnormal blocks.
std::vector<float> inputs(size_t n, uint32_t block, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::ldexp(mant(rng), static_cast<int>(rng() % 24) - 16);
  const size_t b = block == 0 ? 64 : block;
  for (size_t start = 0; start < n; start += b) {
    const size_t len = std::min(b, n - start);
    switch (rng() % 8) {
      case 0: std::fill(v.begin() + start, v.begin() + start + len, 0.0f); break;
      case 1: v[start + rng() % len] = std::numeric_limits<float>::quiet_NaN(); break;
      case 2: v[start + rng() % len] = -std::numeric_limits<float>::infinity(); break;
      case 3:
        for (size_t i = 0; i < len; ++i) v[start + i] *= 0x1p-130f;
        break;
      case 4: v[start] = std::numeric_limits<float>::max(); break;
      default: break;
    }
  }
  return v;
}

// A device buffer for the length of one test.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T) + 16), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() { return p_; }
  void put(const std::vector<T>& v) {
    ASSERT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> take() {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

void expectSameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(bitsOf(a[i]), bitsOf(b[i])) << what << " element " << i << ": " << a[i] << " vs "
                                          << b[i];
  }
}

void checkAgainstCpu(const Codec& c, size_t n, uint32_t block, bool sr) {
  SCOPED_TRACE(std::string(c.name) + " n=" + std::to_string(n) + " block=" +
               std::to_string(block) + (sr ? " sr" : ""));
  CodecParams p;
  p.blockSize = block;
  p.stochasticRounding = sr;
  p.seed = 99 + n;
  const std::vector<float> x = inputs(n, block, n * 3 + block);
  const size_t bytes = c.encodedBytes(n, p);
  ASSERT_GT(bytes, 0u);

  std::vector<uint8_t> cpu(bytes);
  ASSERT_TRUE(c.encode(x.data(), DataType::kFloat32, n, p, cpu.data(), bytes).isOk());

  DeviceBuffer<float> dx(n), dy(n);
  DeviceBuffer<uint8_t> dstream(bytes);
  dx.put(x);
  ASSERT_EQ(cudaMemset(dstream.get(), 0xa5, bytes), cudaSuccess);
  const Status s = encodeCuda(c, dx.get(), n, p, dstream.get(), bytes, nullptr);
  ASSERT_TRUE(s.isOk()) << s.toString();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> gpu = dstream.take();
  for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(gpu[i], cpu[i]) << "stream byte " << i;

  // decode
  std::vector<float> want(n);
  ASSERT_TRUE(c.decode(cpu.data(), bytes, want.data(), n).isOk());
  ASSERT_TRUE(decodeCuda(c, p, dstream.get(), bytes, dy.get(), n, nullptr).isOk());
  expectSameBits(dy.take(), want, "decode");

  // decodeAccumulate onto values that include NaNs and infinities
  std::vector<float> acc = inputs(n, 32, 7 + n);
  dy.put(acc);
  ASSERT_TRUE(c.decodeAccumulate(cpu.data(), bytes, acc.data(), n).isOk());
  ASSERT_TRUE(decodeAccumulateCuda(c, p, dstream.get(), bytes, dy.get(), n, nullptr).isOk());
  expectSameBits(dy.take(), acc, "decodeAccumulate");

  // error feedback
  std::vector<float> residual = inputs(n, 32, 11 + n);
  dy.put(residual);
  ASSERT_TRUE(encodeWithFeedback(c, x.data(), residual.data(), n, p, cpu.data(), bytes).isOk());
  ASSERT_TRUE(
      encodeWithFeedbackCuda(c, dx.get(), dy.get(), n, p, dstream.get(), bytes, nullptr).isOk());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> gpuFeedback = dstream.take();
  for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(gpuFeedback[i], cpu[i]) << "feedback byte " << i;
  expectSameBits(dy.take(), residual, "residual");
}

TEST(CodecCuda, BitIdenticalToCpu) {
  SKIP_WITHOUT_DEVICE();
  ASSERT_TRUE(cudaCodecsBuilt());
  const size_t lengths[] = {0, 1, 31, 32, 33, 255, 1000, 4097, 65537, 1 << 20};
  for (size_t k = 0; k < static_cast<size_t>(CodecId::kNumCodecs); ++k) {
    const Codec& c = codecTable()[k];
    const bool quant = c.id == CodecId::kInt8 || c.id == CodecId::kInt4;
    const std::vector<uint32_t> blocks =
        quant ? std::vector<uint32_t>{32, 64, 96, 256, 4096} : std::vector<uint32_t>{0};
    for (const uint32_t block : blocks) {
      for (const size_t n : lengths) {
        for (const bool sr : {false, true}) {
          if (sr && !quant) continue;
          checkAgainstCpu(c, n, block, sr);
        }
      }
    }
  }
}

TEST(CodecCuda, StreamOfOneCudaEncodeDecodesOnTheCpu) {
  SKIP_WITHOUT_DEVICE();
  const Codec& c = codecById(CodecId::kInt4);
  const size_t n = 12345;
  const std::vector<float> x = inputs(n, 64, 5);
  const size_t bytes = c.encodedBytes(n, {});
  DeviceBuffer<float> dx(n);
  DeviceBuffer<uint8_t> ds(bytes);
  dx.put(x);
  ASSERT_TRUE(encodeCuda(c, dx.get(), n, {}, ds.get(), bytes, nullptr).isOk());
  const std::vector<uint8_t> stream = ds.take();
  const Result<StreamInfo> info = inspectStream(stream.data(), stream.size());
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  std::vector<float> y(n);
  EXPECT_TRUE(c.decode(stream.data(), stream.size(), y.data(), n).isOk());
}

// These fail before any CUDA call, so they need no device.
TEST(CodecCudaArgs, Rejected) {
  const Codec& c = codecById(CodecId::kInt8);
  alignas(16) static uint8_t stream[64];
  static float x[8];
  EXPECT_EQ(encodeCuda(c, x, 8, {}, stream, 10, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(encodeCuda(c, x, 8, {}, stream + 1, 63, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(encodeCuda(c, nullptr, 8, {}, stream, 64, nullptr).code(),
            StatusCode::kInvalidArgument);
  CodecParams bad;
  bad.blockSize = 48;
  EXPECT_EQ(encodeCuda(c, x, 8, bad, stream, 64, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(decodeCuda(c, {}, stream, 10, x, 8, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(decodeAccumulateCuda(c, {}, stream, 64, nullptr, 8, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(encodeWithFeedbackCuda(c, x, nullptr, 8, {}, stream, 64, nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace nanoccl::codec
