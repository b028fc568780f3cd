// The device rows on the CUDA device (collectives/device/cuda_device.h): ranks as threads of one
// process, each with its own stream. Two nodes of one rank each need one GPU (no NCCL: the
// staging path alone); a node of two ranks needs two GPUs (NCCL). Without a GPU the tests that
// need one skip, and the "no device" answer is checked. scripts/gpu_check.sh runs them on a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/device/cuda_device.h"
#include "tests/collectives/test_util.h"
#include "tests/cuda/cuda_test_util.h"

namespace nanoccl::cudatest {
namespace {

using colltest::WorldOptions;
using std::chrono::milliseconds;

// A world of communicators on `nodeIds`, rank r queuing on its own stream of GPU gpuOf(r).
struct CudaWorld {
  std::vector<std::shared_ptr<Communicator>> comms;
  std::vector<std::shared_ptr<CudaDevice>> devices;
  std::vector<cudaStream_t> streams;
  ~CudaWorld() {
    comms.clear();
    devices.clear();
    for (cudaStream_t s : streams) (void)cudaStreamDestroy(s);
  }
};

void makeWorld(const std::vector<std::string>& nodeIds, CudaWorld* w, int gpus,
               milliseconds timeout = milliseconds(30000)) {
  WorldOptions o;
  o.nodeIds = nodeIds;
  o.size = static_cast<int>(nodeIds.size());
  o.timeout = timeout;
  const Status s = colltest::makeWorld(o, &w->comms);
  ASSERT_TRUE(s.isOk()) << s.toString();
  for (int r = 0; r < o.size; ++r) {
    const int gpu = r % gpus;
    ASSERT_EQ(cudaSetDevice(gpu), cudaSuccess);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    w->streams.push_back(stream);
    Result<std::shared_ptr<CudaDevice>> d = CudaDevice::create(gpu, stream);
    ASSERT_TRUE(d.isOk()) << d.status().toString();
    w->devices.push_back(d.value());
  }
}

std::vector<Status> finish(CudaWorld& w, const std::vector<std::shared_ptr<Task>>& tasks) {
  std::vector<Status> out = colltest::waitAll(tasks);
  for (size_t r = 0; r < tasks.size(); ++r) {
    if (!out[r].isOk()) continue;
    out[r] = waitFence(*w.devices[r], *tasks[r]->deviceEnd(), Deadline::after(milliseconds(30000)),
                       "the call's GPU work");
  }
  return out;
}

TEST(CudaDeviceTest, SaysWhyWithoutADevice) {
  if (deviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  Result<std::shared_ptr<CudaDevice>> d = CudaDevice::create(0, nullptr);
  ASSERT_FALSE(d.isOk());
  EXPECT_TRUE(d.status().code() == StatusCode::kUnavailable ||
              d.status().code() == StatusCode::kInvalidArgument)
      << d.status().toString();
}

// Two nodes of one rank on one GPU: the staged allreduce's chunk pipeline through pinned
// memory (several chunks), and the staged broadcast, allgather and reduce_scatter.
TEST(CudaDeviceTest, StagedCallsTwoNodesOneGpu) {
  NANOCCL_SKIP_WITHOUT_DEVICES(1);
  CudaWorld w;
  makeWorld({"a", "b"}, &w, 1);
  for (size_t count : {size_t{1}, size_t{1001}, size_t{3000000}}) {
    SCOPED_TRACE(count);
    std::vector<std::unique_ptr<DeviceBuffer<float>>> bufs;
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < 2; ++r) {
      bufs.push_back(std::make_unique<DeviceBuffer<float>>(count));
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((r + 1) * (i % 1000));
      bufs[r]->put(v);
      DeviceCall call;
      call.recv = bufs[r]->get();
      call.count = count;
      call.device = w.devices[r];
      tasks.push_back(w.comms[r]->deviceCall(call));
    }
    for (const Status& s : finish(w, tasks)) ASSERT_TRUE(s.isOk()) << s.toString();
    for (int r = 0; r < 2; ++r) {
      const std::vector<float> got = bufs[r]->take();
      for (size_t i = 0; i < count; i += 997) ASSERT_EQ(got[i], 3.0f * (i % 1000)) << i;
    }
  }
  // allgather and reduce_scatter of 1000 floats a rank, broadcast from rank 1.
  std::vector<std::unique_ptr<DeviceBuffer<float>>> in, out;
  std::vector<std::shared_ptr<Task>> tasks;
  for (OpType op : {OpType::kAllgather, OpType::kReduceScatter, OpType::kBroadcast}) {
    SCOPED_TRACE(opTypeName(op));
    in.clear();
    out.clear();
    tasks.clear();
    for (int r = 0; r < 2; ++r) {
      const size_t inCount = op == OpType::kReduceScatter ? 2000 : 1000;
      const size_t outCount = op == OpType::kAllgather ? 2000 : 1000;
      in.push_back(std::make_unique<DeviceBuffer<float>>(inCount));
      out.push_back(std::make_unique<DeviceBuffer<float>>(outCount));
      in[r]->put(std::vector<float>(inCount, static_cast<float>(r + 1)));
      DeviceCall call;
      call.op = op;
      call.root = 1;
      call.send = in[r]->get();
      call.recv = out[r]->get();
      call.count = 1000;
      call.device = w.devices[r];
      tasks.push_back(w.comms[r]->deviceCall(call));
    }
    for (const Status& s : finish(w, tasks)) ASSERT_TRUE(s.isOk()) << s.toString();
    for (int r = 0; r < 2; ++r) {
      const std::vector<float> got = out[r]->take();
      for (size_t i = 0; i < got.size(); ++i) {
        const float want = op == OpType::kAllgather     ? static_cast<float>(i / 1000 + 1)
                           : op == OpType::kReduceScatter ? 3.0f
                                                          : 2.0f;
        ASSERT_EQ(got[i], want) << "rank " << r << " element " << i;
      }
    }
  }
}

// One node of two GPUs (NCCL as the node stage) and two nodes of two (NCCL, then staging).
TEST(CudaDeviceTest, NodeStagesOnNccl) {
  NANOCCL_SKIP_WITHOUT_DEVICES(2);
  for (const std::vector<std::string>& ids :
       {std::vector<std::string>{"a", "a"}, std::vector<std::string>{"a", "a", "b", "b"}}) {
    CudaWorld w;
    makeWorld(ids, &w, 2);
    const int n = static_cast<int>(ids.size());
    const size_t count = 1 << 20;
    std::vector<std::unique_ptr<DeviceBuffer<float>>> bufs;
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      bufs.push_back(std::make_unique<DeviceBuffer<float>>(count, r % 2));
      bufs[r]->put(std::vector<float>(count, static_cast<float>(r + 1)));
      DeviceCall call;
      call.redop = ReduceOp::kAvg;
      call.recv = bufs[r]->get();
      call.count = count;
      call.device = w.devices[r];
      tasks.push_back(w.comms[r]->deviceCall(call));
    }
    for (const Status& s : finish(w, tasks)) ASSERT_TRUE(s.isOk()) << s.toString();
    const float want = static_cast<float>(n + 1) / 2;
    for (int r = 0; r < n; ++r) {
      const std::vector<float> got = bufs[r]->take();
      ASSERT_EQ(got.front(), want);
      ASSERT_EQ(got.back(), want);
    }
  }
}

// A one-rank node on one GPU: every call is one NCCL node stage (a one-rank communicator runs
// every collective), so NCCL's calls, its premul_sum and avg operators, the byte form of a type
// it lacks and the device's shutdown run on one GPU; and the node stage's bad arguments.
TEST(CudaDeviceTest, NcclNodeStagesOneRank) {
  NANOCCL_SKIP_WITHOUT_DEVICES(1);
  CudaWorld w;
  makeWorld({"a"}, &w, 1);
  const size_t n = 1000;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i + 1);
  DeviceBuffer<float> in(n), out(n);
  auto run = [&](DeviceCall call) {
    call.device = w.devices[0];
    return finish(w, {w.comms[0]->deviceCall(call)})[0];
  };
  struct Case {
    OpType op;
    ReduceOp redop;
    float scale;
  };
  for (const Case& c : {Case{OpType::kAllreduce, ReduceOp::kSum, 1.0f},
                        Case{OpType::kAllreduce, ReduceOp::kPremulSum, 0.5f},
                        Case{OpType::kAllreduce, ReduceOp::kAvg, 1.0f},
                        Case{OpType::kReduceScatter, ReduceOp::kMax, 1.0f},
                        Case{OpType::kAllgather, ReduceOp::kSum, 1.0f},
                        Case{OpType::kBroadcast, ReduceOp::kSum, 1.0f}}) {
    SCOPED_TRACE(std::string(opTypeName(c.op)) + " " + reduceOpName(c.redop));
    in.put(x);
    out.put(std::vector<float>(n, -1.0f));
    DeviceCall call;
    call.op = c.op;
    call.redop = c.redop;
    call.premulFactor = 0.5;
    call.send = in.get();
    call.recv = out.get();
    call.count = n;
    const Status s = run(call);
    ASSERT_TRUE(s.isOk()) << s.toString();
    std::vector<float> want = x;
    for (float& v : want) v *= c.scale;
    EXPECT_EQ(out.take(), want);
  }
  // int16: NCCL has no such type; broadcast moves its bytes, a sum is refused at the call.
  DeviceBuffer<int16_t> shorts(n);
  shorts.put(std::vector<int16_t>(n, 7));
  DeviceCall call;
  call.op = OpType::kBroadcast;
  call.dtype = DataType::kInt16;
  call.recv = shorts.get();
  call.count = n;
  const Status moved = run(call);
  ASSERT_TRUE(moved.isOk()) << moved.toString();
  EXPECT_EQ(shorts.take(), std::vector<int16_t>(n, 7));
  call.op = OpType::kAllreduce;
  EXPECT_EQ(run(call).code(), StatusCode::kInvalidArgument);
  w.devices[0]->shutdown(Deadline::after(milliseconds(30000)));
}

// A stream that stalls after the call's host stages (a host function sleeping on it, longer
// than the timeout): the watchdog fails the communicator and aborts the device; the fence
// reports it instead of hanging.
TEST(CudaDeviceTest, WatchdogEndsStalledStream) {
  NANOCCL_SKIP_WITHOUT_DEVICES(1);
  CudaWorld w;
  makeWorld({"a", "b"}, &w, 1, milliseconds(1500));
  std::vector<std::unique_ptr<DeviceBuffer<float>>> bufs;
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 2; ++r) bufs.push_back(std::make_unique<DeviceBuffer<float>>(1000));
  ASSERT_EQ(cudaLaunchHostFunc(
                w.streams[1],
                [](void*) { std::this_thread::sleep_for(std::chrono::seconds(4)); }, nullptr),
            cudaSuccess);
  for (int r = 0; r < 2; ++r) {
    DeviceCall call;
    call.op = OpType::kBroadcast;
    call.root = 0;
    call.recv = bufs[r]->get();
    call.count = 1000;
    call.device = w.devices[r];
    tasks.push_back(w.comms[r]->deviceCall(call));
  }
  const std::vector<Status> st = colltest::waitAll(tasks);
  ASSERT_TRUE(st[1].isOk()) << st[1].toString();
  const Status end = waitFence(*w.devices[1], *tasks[1]->deviceEnd(),
                               Deadline::after(milliseconds(20000)), "the copy back");
  EXPECT_FALSE(end.isOk());
  (void)cudaStreamSynchronize(w.streams[1]);
}

// A rank calling on host memory where its peer calls on GPU memory: kMismatch on a rank.
TEST(CudaDeviceTest, HostAndDeviceCallsMismatch) {
  NANOCCL_SKIP_WITHOUT_DEVICES(1);
  CudaWorld w;
  makeWorld({"a", "b"}, &w, 1, milliseconds(5000));
  DeviceBuffer<float> dev(100);
  std::vector<float> host(100, 1.0f);
  DeviceCall call;
  call.recv = dev.get();
  call.count = 100;
  call.device = w.devices[0];
  const std::vector<Status> st = colltest::waitAll(
      {w.comms[0]->deviceCall(call),
       w.comms[1]->allreduce(host.data(), 100, DataType::kFloat32, ReduceOp::kSum)});
  EXPECT_FALSE(st[0].isOk());
  EXPECT_FALSE(st[1].isOk());
  EXPECT_TRUE(st[0].code() == StatusCode::kMismatch || st[1].code() == StatusCode::kMismatch);
}

}  // namespace
}  // namespace nanoccl::cudatest
