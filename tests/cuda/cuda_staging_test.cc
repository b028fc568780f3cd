// CudaGroup (backend/cuda_staging.h), ranks as threads over one InMemoryStore, against
// references computed here. Topologies are emulated with node ids; each needs as many devices
// as its highest device index + 1 and skips otherwise. "2x1 on one device" is what a machine
// with one GPU runs: two one-rank "nodes" on cuda:0, so every call goes through host staging
// (no NCCL: NCCL cannot put two ranks on one GPU).
//
// Each call checks the stream semantics too: the input is copied to the device on the caller's
// stream just before submit() without any synchronization (the call must wait for it), and the
// result is read back on the caller's stream after blockStream() (which must order it after
// the call), with no device-wide synchronization in between.
#include "backend/cuda_staging.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda/cuda_test_util.h"

namespace nanoccl {
namespace {

using cudatest::DeviceBuffer;

constexpr std::chrono::milliseconds kTimeout{60000};

struct TopologyCase {
  std::string name;
  std::vector<std::string> nodeIds;  // per rank
  std::vector<int> devices;          // per rank
};

// gtest prints a parameter with this (test names in ctest), not as bytes.
void PrintTo(const TopologyCase& t, std::ostream* os) { *os << t.name; }

int devicesNeeded(const TopologyCase& t) {
  int n = 0;
  for (int d : t.devices) n = std::max(n, d + 1);
  return n;
}

Config testConfig() {
  Config c;
  c.socketIfname = "lo";
  c.tcpEngine = "epoll";
  return c;
}

// One CudaGroup per rank, each with its own internal and caller streams on its device.
class World {
 public:
  World(const TopologyCase& t, std::chrono::milliseconds timeout) : t_(t) {
    static int worlds = 0;
    const std::string commId = "cudaworld" + std::to_string(worlds++);
    const int size = static_cast<int>(t.nodeIds.size());
    const Topology topo = Topology::fromNodeIds(t.nodeIds);
    for (int r = 0; r < size; ++r) {
      cudaSetDevice(t.devices[r]);
      cudaStream_t internal = nullptr, caller = nullptr;
      EXPECT_EQ(cudaStreamCreateWithFlags(&internal, cudaStreamNonBlocking), cudaSuccess);
      EXPECT_EQ(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), cudaSuccess);
      internal_.push_back(internal);
      caller_.push_back(caller);
      CudaGroupOptions o;
      o.rank = r;
      o.size = size;
      o.topology = topo;
      o.store = store_;
      o.commId = commId;
      o.config = testConfig();
      o.timeout = timeout;
      o.device = t.devices[r];
      o.stream = internal;
      auto g = CudaGroup::create(o);
      EXPECT_TRUE(g.isOk()) << g.status().toString();
      groups_.push_back(g.isOk() ? g.value() : nullptr);
    }
  }
  ~World() {
    for (auto& g : groups_) {
      if (g) g->shutdown(Deadline::after(kTimeout));
      g.reset();
    }
    for (size_t r = 0; r < internal_.size(); ++r) {
      cudaStreamDestroy(internal_[r]);
      cudaStreamDestroy(caller_[r]);
    }
  }

  int size() const { return static_cast<int>(groups_.size()); }
  int device(int r) const { return t_.devices[r]; }
  CudaGroup& group(int r) { return *groups_[r]; }
  cudaStream_t caller(int r) const { return caller_[r]; }

  // fn(rank) on one thread per rank; returns the ranks' errors ("" where none).
  std::vector<std::string> each(const std::function<std::string(int)>& fn) {
    std::vector<std::string> errors(groups_.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) {
      threads.emplace_back([&, r] {
        cudaSetDevice(t_.devices[r]);
        errors[r] = fn(r);
      });
    }
    for (auto& th : threads) th.join();
    return errors;
  }

 private:
  TopologyCase t_;
  std::shared_ptr<Store> store_ = std::make_shared<InMemoryStore>();
  std::vector<std::shared_ptr<CudaGroup>> groups_;
  std::vector<cudaStream_t> internal_, caller_;
};

// Pinned host memory for one rank's transfers.
class Pinned {
 public:
  explicit Pinned(size_t bytes) { cudaMallocHost(&p_, bytes == 0 ? 1 : bytes); }
  ~Pinned() { cudaFreeHost(p_); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// Runs `call` (op, dtype, reduction, root, count) on every rank with inputs[r] (the elements
// `send` holds: count, or size x count for reduce_scatter) and returns every rank's output.
template <typename T>
std::vector<std::vector<T>> runOnAll(World& w, CudaCall base,
                                     const std::vector<std::vector<T>>& inputs) {
  const size_t n = base.count;
  const size_t size = static_cast<size_t>(w.size());
  const bool inPlace = base.op == OpType::kAllreduce || base.op == OpType::kBroadcast;
  const size_t sendElems = base.op == OpType::kReduceScatter ? n * size : n;
  const size_t recvElems = base.op == OpType::kAllgather ? n * size : n;
  std::vector<std::vector<T>> out(size);
  const auto errors = w.each([&](int r) -> std::string {
    DeviceBuffer<T> send(sendElems, w.device(r)), recv(recvElems, w.device(r));
    Pinned in(sendElems * sizeof(T)), result(recvElems * sizeof(T));
    std::memcpy(in.get(), inputs[r].data(), sendElems * sizeof(T));
    cudaStream_t caller = w.caller(r);
    T* target = inPlace ? recv.get() : send.get();
    if (cudaMemcpyAsync(target, in.get(), sendElems * sizeof(T), cudaMemcpyHostToDevice,
                        caller) != cudaSuccess) {
      return "the input copy failed";
    }
    CudaCall call = base;
    call.send = inPlace ? nullptr : send.get();
    call.recv = recv.get();
    auto job = w.group(r).submit(call, caller);
    if (!job.isOk()) return "submit: " + job.status().toString();
    Status s = job.value()->waitEnqueued(Deadline::after(kTimeout));
    if (s.isOk()) s = job.value()->blockStream(caller);
    if (!s.isOk()) return s.toString();
    if (cudaMemcpyAsync(result.get(), recv.get(), recvElems * sizeof(T), cudaMemcpyDeviceToHost,
                        caller) != cudaSuccess ||
        cudaStreamSynchronize(caller) != cudaSuccess) {
      return "reading the result failed";
    }
    // Done on the GPU soon after: the executor retires it within its poll period.
    const Deadline done = Deadline::after(kTimeout);
    while (!job.value()->finished() && !done.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!job.value()->finished()) return "the job never finished";
    if (!job.value()->status().isOk()) return job.value()->status().toString();
    out[r].resize(recvElems);
    std::memcpy(out[r].data(), result.get(), recvElems * sizeof(T));
    return "";
  });
  for (size_t r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

// Small integers (exact in float, whatever the summation order).
template <typename T>
std::vector<std::vector<T>> inputsFor(size_t size, size_t count) {
  std::vector<std::vector<T>> in(size, std::vector<T>(count));
  for (size_t r = 0; r < size; ++r) {
    for (size_t i = 0; i < count; ++i) in[r][i] = static_cast<T>(3 * (r + 1) + (i * 7 + r) % 11);
  }
  return in;
}

class CudaGroupTest : public ::testing::TestWithParam<TopologyCase> {};

TEST_P(CudaGroupTest, CollectivesMatchReferences) {
  const TopologyCase& t = GetParam();
  NANOCCL_SKIP_WITHOUT_DEVICES(devicesNeeded(t));
  World w(t, kTimeout);
  const size_t size = t.nodeIds.size();

  // allreduce sum: one chunk, an odd count (the uneven shard plan), several staging chunks.
  for (size_t n : {size_t{1000}, size_t{1001}, (size_t{3} << 20) + 3}) {
    auto in = inputsFor<float>(size, n);
    std::vector<float> want(n, 0.0f);
    for (size_t r = 0; r < size; ++r) {
      for (size_t i = 0; i < n; ++i) want[i] += in[r][i];
    }
    CudaCall c;
    c.op = OpType::kAllreduce;
    c.dtype = DataType::kFloat32;
    c.redop = ReduceOp::kSum;
    c.count = n;
    auto got = runOnAll(w, c, in);
    for (size_t r = 0; r < size; ++r) EXPECT_EQ(got[r], want) << "sum of " << n << ", rank " << r;
  }
  {  // avg divides once by the group size; premul_sum scales each input once
    const size_t n = 1001;
    auto in = inputsFor<float>(size, n);
    std::vector<float> sum(n, 0.0f), scaled(n, 0.0f);
    for (size_t r = 0; r < size; ++r) {
      for (size_t i = 0; i < n; ++i) {
        sum[i] += in[r][i];
        scaled[i] += in[r][i] * 0.5f;
      }
    }
    std::vector<float> avg(n);
    for (size_t i = 0; i < n; ++i) avg[i] = sum[i] / static_cast<float>(size);
    CudaCall c;
    c.op = OpType::kAllreduce;
    c.dtype = DataType::kFloat32;
    c.redop = ReduceOp::kAvg;
    c.count = n;
    auto got = runOnAll(w, c, in);
    for (size_t r = 0; r < size; ++r) EXPECT_EQ(got[r], avg) << "avg, rank " << r;
    c.redop = ReduceOp::kPremulSum;
    c.premulFactor = 0.5;
    got = runOnAll(w, c, in);
    for (size_t r = 0; r < size; ++r) EXPECT_EQ(got[r], scaled) << "premul_sum, rank " << r;
  }
  {  // max on int32
    const size_t n = 777;
    auto in = inputsFor<int32_t>(size, n);
    std::vector<int32_t> want = in[0];
    for (size_t r = 1; r < size; ++r) {
      for (size_t i = 0; i < n; ++i) want[i] = std::max(want[i], in[r][i]);
    }
    CudaCall c;
    c.op = OpType::kAllreduce;
    c.dtype = DataType::kInt32;
    c.redop = ReduceOp::kMax;
    c.count = n;
    auto got = runOnAll(w, c, in);
    for (size_t r = 0; r < size; ++r) EXPECT_EQ(got[r], want) << "max, rank " << r;
  }
  {  // broadcast from the last rank, as bytes
    const size_t n = 5000;
    auto in = inputsFor<uint8_t>(size, n);
    CudaCall c;
    c.op = OpType::kBroadcast;
    c.dtype = DataType::kUInt8;
    c.root = static_cast<int>(size) - 1;
    c.count = n;
    auto got = runOnAll(w, c, in);
    for (size_t r = 0; r < size; ++r) EXPECT_EQ(got[r], in[size - 1]) << "broadcast, rank " << r;
  }
  {  // allgather: every rank's part, in rank order
    const size_t n = 257;
    auto in = inputsFor<float>(size, n);
    std::vector<float> want;
    for (size_t r = 0; r < size; ++r) want.insert(want.end(), in[r].begin(), in[r].end());
    CudaCall c;
    c.op = OpType::kAllgather;
    c.dtype = DataType::kFloat32;
    c.count = n;
    auto got = runOnAll(w, c, in);
    for (size_t r = 0; r < size; ++r) EXPECT_EQ(got[r], want) << "allgather, rank " << r;
  }
  {  // reduce_scatter: rank r gets the sum of every rank's part r
    const size_t n = 129;
    auto in = inputsFor<float>(size, n * size);
    CudaCall c;
    c.op = OpType::kReduceScatter;
    c.dtype = DataType::kFloat32;
    c.redop = ReduceOp::kSum;
    c.count = n;
    auto got = runOnAll(w, c, in);
    for (size_t r = 0; r < size; ++r) {
      std::vector<float> want(n, 0.0f);
      for (size_t q = 0; q < size; ++q) {
        for (size_t i = 0; i < n; ++i) want[i] += in[q][r * n + i];
      }
      EXPECT_EQ(got[r], want) << "reduce_scatter, rank " << r;
    }
  }
  const CommStats stats = w.group(0).stats();
  EXPECT_FALSE(stats.callsPerAlgorithm.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, CudaGroupTest,
    ::testing::Values(TopologyCase{"two_nodes_one_device", {"n0", "n1"}, {0, 0}},
                      TopologyCase{"one_node_two_devices", {"n0", "n0"}, {0, 1}},
                      TopologyCase{"uneven_2_plus_1", {"a", "a", "b"}, {0, 1, 2}},
                      TopologyCase{"two_by_two", {"a", "a", "b", "b"}, {0, 1, 2, 3}}),
    [](const ::testing::TestParamInfo<TopologyCase>& info) { return info.param.name; });

// Nothing hangs: a call whose peer never makes it fails within the timeout, and so does every
// later call, at once.
TEST(CudaGroupFaultTest, PeerThatNeverCallsFailsWithinTheTimeout) {
  NANOCCL_SKIP_WITHOUT_DEVICES(1);
  World w(TopologyCase{"two_nodes_one_device", {"n0", "n1"}, {0, 0}},
          std::chrono::milliseconds(3000));
  DeviceBuffer<float> buf(1024);
  CudaCall c;
  c.op = OpType::kAllreduce;
  c.dtype = DataType::kFloat32;
  c.recv = buf.get();
  c.count = 1024;
  const auto start = std::chrono::steady_clock::now();
  auto job = w.group(0).submit(c, w.caller(0));
  ASSERT_TRUE(job.isOk()) << job.status().toString();
  const Status s = job.value()->waitEnqueued(Deadline::after(std::chrono::seconds(60)));
  EXPECT_FALSE(s.isOk()) << "the peer never called, yet the call succeeded";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_TRUE(job.value()->finished());
  auto later = w.group(0).submit(c, w.caller(0));
  EXPECT_FALSE(later.isOk());
}

TEST(CudaGroupFaultTest, RejectsWhatItCannotRun) {
  NANOCCL_SKIP_WITHOUT_DEVICES(1);
  World w(TopologyCase{"two_nodes_one_device", {"n0", "n1"}, {0, 0}}, kTimeout);
  DeviceBuffer<float> buf(16);
  CudaCall c;
  c.recv = buf.get();
  c.count = 16;
  c.op = OpType::kAlltoall;
  EXPECT_EQ(w.group(0).submit(c, nullptr).status().code(), StatusCode::kInvalidArgument);
  c.op = OpType::kAllreduce;
  c.dtype = DataType::kInt16;  // no NCCL type
  EXPECT_EQ(w.group(0).submit(c, nullptr).status().code(), StatusCode::kInvalidArgument);
  c.dtype = DataType::kInt32;
  c.redop = ReduceOp::kBand;  // no NCCL op
  EXPECT_EQ(w.group(0).submit(c, nullptr).status().code(), StatusCode::kInvalidArgument);
  c.op = OpType::kBroadcast;
  c.root = 2;
  EXPECT_EQ(w.group(0).submit(c, nullptr).status().code(), StatusCode::kInvalidArgument);
}

// Without a device, create() says so (the backend turns that into its error message).
TEST(CudaGroupFaultTest, CreateWithoutDeviceSaysWhy) {
  if (cudatest::deviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  CudaGroupOptions o;
  o.topology = Topology::fromNodeIds({"n0"});
  o.store = std::make_shared<InMemoryStore>();
  auto g = CudaGroup::create(o);
  ASSERT_FALSE(g.isOk());
  EXPECT_EQ(g.status().code(), StatusCode::kUnavailable) << g.status().toString();
}

}  // namespace
}  // namespace nanoccl
