// Helpers of the CUDA tests: how many devices there are, and device buffers for one test.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

namespace nanoccl::cudatest {

// CUDA devices usable here (0 without a driver or a GPU).
inline int deviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

#define NANOCCL_SKIP_WITHOUT_DEVICES(n)                                                     \
  if (::nanoccl::cudatest::deviceCount() < (n))                                             \
  GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found "                              \
               << ::nanoccl::cudatest::deviceCount()

// `n` elements of T on `device`, freed at the end of the test.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer(size_t n, int device = 0) : n_(n) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), (n == 0 ? 1 : n) * sizeof(T)),
              cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void put(const std::vector<T>& v) {
    ASSERT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  // Synchronous: waits for everything before it on the legacy default stream (and so for
  // every blocking stream of the device).
  std::vector<T> take() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  size_t n_;
  T* p_ = nullptr;
};

}  // namespace nanoccl::cudatest
