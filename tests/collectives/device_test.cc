// The device rows of the algorithm table (collectives/device/rows.cc) through the host device
// (collectives/device/host_device.h): the plans the CUDA device runs, with the bytes in host
// memory and every copy run later on the device's own thread. Ranks as threads, emulated
// topologies (node ids). `ctest -R Device` selects these suites.
#include <dirent.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/device/host_device.h"
#include "common/reduce.h"
#include "test_util.h"

namespace nanoccl::colltest {
namespace {

using std::chrono::milliseconds;

struct Topo {
  std::string name;
  std::vector<std::string> nodeIds;
};

const std::vector<Topo>& topologies() {
  static const std::vector<Topo> all = {{"1x1", {"a"}},
                                        {"1x2", {"a", "a"}},
                                        {"2x1", {"a", "b"}},
                                        {"2x2", {"a", "a", "b", "b"}},
                                        {"2p1", {"a", "a", "b"}}};  // uneven nodes
  return all;
}

const Topo& topology(const std::string& name) {
  for (const Topo& t : topologies()) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("no topology " + name);
}

// A world of communicators, each rank with a host device of its own.
struct DeviceWorld {
  std::vector<std::shared_ptr<Communicator>> comms;
  std::vector<std::shared_ptr<HostDevice>> devices;
  int size() const { return static_cast<int>(comms.size()); }
};

Status makeDeviceWorld(const std::string& topo, DeviceWorld* w, milliseconds timeout = milliseconds(20000),
                       const std::string& algo = "auto",
                       std::chrono::microseconds opDelay = std::chrono::microseconds(100),
                       const std::string& compression = "none") {
  WorldOptions o;
  o.nodeIds = topology(topo).nodeIds;
  o.size = static_cast<int>(o.nodeIds.size());
  o.timeout = timeout;
  o.algo = algo;
  o.configure = [compression](int, Config& c) { c.compression = compression; };
  NANOCCL_CHECK(makeWorld(o, &w->comms));
  w->devices.clear();
  for (int r = 0; r < o.size; ++r) {
    w->devices.push_back(std::make_shared<HostDevice>());
    // Every copy runs well after the plan queued it: a plan that reads staging memory before
    // the copy's fence reads stale bytes.
    w->devices.back()->setOpDelay(opDelay);
  }
  return Status::ok();
}

// Waits for each call and then for its device work (its end fence).
std::vector<Status> finishAll(DeviceWorld& w, const std::vector<std::shared_ptr<Task>>& tasks) {
  std::vector<Status> out = waitAll(tasks);
  for (size_t r = 0; r < tasks.size(); ++r) {
    if (!out[r].isOk()) continue;
    if (!tasks[r]->deviceEnd()) {
      out[r] = internalError("a device call without an end fence");
      continue;
    }
    out[r] = waitFence(*w.devices[r], *tasks[r]->deviceEnd(), Deadline::after(milliseconds(30000)),
                       "the call's device work");
  }
  return out;
}

// ---- Every row x topology x dtype x count, against the reference --------------------------

struct DevCase {
  std::string topo;
  OpType op;
  DataType dtype;
  ReduceOp redop;
  size_t count;
  bool outOfPlace;  // allreduce, broadcast: send != recv
};

std::string devCaseName(const ::testing::TestParamInfo<DevCase>& info) {
  const DevCase& c = info.param;
  std::string s = c.topo + "_" + opTypeName(c.op) + "_" + dataTypeName(c.dtype);
  if (c.op == OpType::kAllreduce || c.op == OpType::kReduceScatter) {
    s += std::string("_") + reduceOpName(c.redop);
  }
  s += "_c" + std::to_string(c.count);
  if (c.outOfPlace) s += "_outofplace";
  return s;
}

std::vector<DevCase> devCases() {
  std::vector<DevCase> out;
  for (const Topo& t : topologies()) {
    bool flip = false;
    for (const Combo& combo : reductionCombos(false)) {
      out.push_back({t.name, OpType::kAllreduce, combo.dtype, combo.op, 1001, flip});
      flip = !flip;
    }
    out.push_back({t.name, OpType::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 1, false});
    out.push_back({t.name, OpType::kBroadcast, DataType::kFloat32, ReduceOp::kSum, 1001, true});
    out.push_back({t.name, OpType::kBroadcast, DataType::kInt64, ReduceOp::kSum, 1, false});
    out.push_back({t.name, OpType::kAllgather, DataType::kFloat16, ReduceOp::kSum, 1001, false});
    out.push_back({t.name, OpType::kAllgather, DataType::kUInt8, ReduceOp::kSum, 1, false});
    out.push_back({t.name, OpType::kReduceScatter, DataType::kFloat32, ReduceOp::kSum, 1001, false});
    out.push_back({t.name, OpType::kReduceScatter, DataType::kFloat64, ReduceOp::kPremulSum, 7, false});
    out.push_back({t.name, OpType::kReduceScatter, DataType::kBFloat16, ReduceOp::kAvg, 64, false});
  }
  // Several staging chunks (4 MB) a shard: the chunk pipeline's slot reuse.
  out.push_back({"2x1", OpType::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 2500000, false});
  out.push_back({"2x2", OpType::kAllreduce, DataType::kFloat32, ReduceOp::kAvg, 4500001, true});
  out.push_back({"2p1", OpType::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 2100000, false});
  return out;
}

class DeviceRows : public ::testing::TestWithParam<DevCase> {};

TEST_P(DeviceRows, MatchReference) {
  const DevCase& c = GetParam();
  DeviceWorld w;
  // Small calls: every queued operation runs 2 ms late, longer than a stage on loopback takes.
  const std::chrono::microseconds delay(c.count > 100000 ? 0 : 2000);
  ASSERT_TRUE(makeDeviceWorld(c.topo, &w, milliseconds(30000), "auto", delay).isOk());
  const int n = w.size();
  const int root = n - 1;
  const DataType t = c.dtype;
  const size_t es = dataTypeSize(t);
  std::vector<std::vector<char>> send(n), recv(n);
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < n; ++r) {
    DeviceCall call;
    call.op = c.op;
    call.dtype = t;
    call.redop = c.redop;
    call.premulFactor = kPremulFactor;
    call.root = root;
    call.count = c.count;
    call.device = w.devices[r];
    const size_t sendCount = c.op == OpType::kReduceScatter ? c.count * n : c.count;
    const size_t recvCount = c.op == OpType::kAllgather ? c.count * n : c.count;
    send[r] = makeBuffer(t, sendCount, [&](size_t i) { return inputValue(t, c.redop, r, i); });
    recv[r] = makeBuffer(t, recvCount, [&](size_t) { return Value(3); });
    switch (c.op) {
      case OpType::kAllreduce:
      case OpType::kBroadcast:
        if (c.outOfPlace) {
          call.send = send[r].data();
        } else {
          recv[r] = send[r];
        }
        break;
      default:
        call.send = send[r].data();
    }
    call.recv = recv[r].data();
    tasks.push_back(w.comms[r]->deviceCall(call));
  }
  const std::vector<Status> st = finishAll(w, tasks);
  for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].isOk()) << "rank " << r << ": " << st[r].toString();
  for (int r = 0; r < n; ++r) {
    const std::string where = "rank " + std::to_string(r);
    switch (c.op) {
      case OpType::kAllreduce:
        expectBuffer(t, recv[r].data(), c.count, [&](size_t i) {
          return referenceReduce(t, c.redop, n, [&](int q) { return inputValue(t, c.redop, q, i); });
        }, where);
        break;
      case OpType::kBroadcast:
        expectBuffer(t, recv[r].data(), c.count,
                     [&](size_t i) { return inputValue(t, c.redop, root, i); }, where);
        break;
      case OpType::kAllgather:
        expectBuffer(t, recv[r].data(), c.count * n, [&](size_t i) {
          return inputValue(t, c.redop, static_cast<int>(i / c.count), i % c.count);
        }, where);
        break;
      case OpType::kReduceScatter:
        expectBuffer(t, recv[r].data(), c.count, [&](size_t i) {
          return referenceReduce(t, c.redop, n,
                                 [&](int q) { return inputValue(t, c.redop, q, r * c.count + i); });
        }, where);
        break;
      default:
        FAIL();
    }
    if (c.op == OpType::kAllreduce || c.op == OpType::kBroadcast) {
      if (c.outOfPlace && (c.op == OpType::kAllreduce || r == root)) {
        // The input is left as it was.
        expectBuffer(t, send[r].data(), c.count,
                     [&](size_t i) { return inputValue(t, c.redop, r, i); }, where + " input");
      }
    }
    // The row that ran is named in the stats, as every row is.
    const std::string row = std::string(opTypeName(c.op)) + "/" +
                            (topology(c.topo).nodeIds.back() == "a" ? "device_node" : "device_staged");
    bool named = false;
    for (const auto& [what, calls] : w.comms[r]->stats().callsPerAlgorithm) {
      named = named || (what == row && calls == 1);
    }
    EXPECT_TRUE(named) << where << ": no call of " << row << " in the stats";
  }
  (void)es;
}

INSTANTIATE_TEST_SUITE_P(Device, DeviceRows, ::testing::ValuesIn(devCases()), devCaseName);

// ---- The engine around the rows -------------------------------------------------------------

// A device allreduce on each rank; `inputs` are each rank's values (in place).
std::vector<std::shared_ptr<Task>> allreduceOnDevices(DeviceWorld& w,
                                                      std::vector<std::vector<float>>& bufs) {
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < w.size(); ++r) {
    DeviceCall call;
    call.recv = bufs[r].data();
    call.count = bufs[r].size();
    call.device = w.devices[r];
    tasks.push_back(w.comms[r]->deviceCall(call));
  }
  return tasks;
}

std::vector<std::vector<float>> rankValues(int n, size_t count) {
  std::vector<std::vector<float>> out(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) out[r][i] = static_cast<float>((r + 1) * 1000 + i % 997);
  }
  return out;
}

// The same inputs through the host path and through the device rows: the same results.
TEST(DeviceCalls, MatchTheHostPath) {
  for (const char* topo : {"1x2", "2x1", "2x2", "2p1"}) {
    SCOPED_TRACE(topo);
    DeviceWorld w;
    ASSERT_TRUE(makeDeviceWorld(topo, &w).isOk());
    const int n = w.size();
    const size_t count = 300007;
    std::vector<std::vector<int32_t>> host(n, std::vector<int32_t>(count)), dev;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) host[r][i] = static_cast<int32_t>(r * 31 + i % 1013);
    }
    dev = host;
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      tasks.push_back(w.comms[r]->allreduce(host[r].data(), count, DataType::kInt32, ReduceOp::kSum));
    }
    expectAllOk(tasks);
    tasks.clear();
    for (int r = 0; r < n; ++r) {
      DeviceCall call;
      call.dtype = DataType::kInt32;
      call.recv = dev[r].data();
      call.count = count;
      call.device = w.devices[r];
      tasks.push_back(w.comms[r]->deviceCall(call));
    }
    for (const Status& s : finishAll(w, tasks)) ASSERT_TRUE(s.isOk()) << s.toString();
    for (int r = 0; r < n; ++r) EXPECT_EQ(host[r], dev[r]) << "rank " << r;
  }
}

// NANOCCL_COMPRESSION on device calls: the staged allreduce's cross-node leg is compressed
// (about a quarter of the bytes cross nodes under int8, every rank ends with the same bits,
// within the codec's error; float16/bfloat16 cross in float32), and within one node calls stay
// lossless.
// float32 <-> `dtype` (float32, float16, bfloat16) for the compressed tests.
Status storeAs(void* out, const float* in, size_t count, DataType dtype) {
  if (dtype != DataType::kFloat32) return narrowFromFloat32(out, in, count, dtype);
  std::memcpy(out, in, count * sizeof(float));
  return Status::ok();
}
Status loadFrom(float* out, const void* in, size_t count, DataType dtype) {
  if (dtype != DataType::kFloat32) return widenToFloat32(out, in, count, dtype);
  std::memcpy(out, in, count * sizeof(float));
  return Status::ok();
}

TEST(DeviceCompressed, StagedAllreduceCompressesTheCrossNodeLegOnly) {
  const size_t count = 2500001;  // 2x2: shards of 1.25M elements, two chunks of float32
  for (const char* topo : {"1x2", "2x1", "2x2"}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16}) {
      SCOPED_TRACE(std::string(topo) + " " + dataTypeName(dtype));
      std::map<std::string, std::vector<std::vector<float>>> got;
      std::map<std::string, uint64_t> crossed;
      std::vector<double> want(count, 0.0);
      for (const char* codec : {"none", "int8"}) {
        DeviceWorld w;
        ASSERT_TRUE(makeDeviceWorld(topo, &w, milliseconds(30000), "auto",
                                    std::chrono::microseconds(0), codec)
                        .isOk());
        const int n = w.size();
        const size_t es = dataTypeSize(dtype);
        std::vector<std::vector<char>> bufs(n, std::vector<char>(count * es));
        for (int r = 0; r < n; ++r) {
          std::vector<float> v(count);
          for (size_t i = 0; i < count; ++i) {
            v[i] = std::sin(static_cast<float>(i) * 0.001f) * static_cast<float>(r + 1);
          }
          ASSERT_TRUE(storeAs(bufs[r].data(), v.data(), count, dtype).isOk());
          if (std::string(codec) == "none") {
            std::vector<float> stored(count);
            ASSERT_TRUE(loadFrom(stored.data(), bufs[r].data(), count, dtype).isOk());
            for (size_t i = 0; i < count; ++i) want[i] += stored[i];
          }
        }
        std::vector<std::shared_ptr<Task>> tasks;
        for (int r = 0; r < n; ++r) {
          DeviceCall call;
          call.dtype = dtype;
          call.recv = bufs[r].data();
          call.count = count;
          call.device = w.devices[r];
          tasks.push_back(w.comms[r]->deviceCall(call));
        }
        for (const Status& s : finishAll(w, tasks)) ASSERT_TRUE(s.isOk()) << s.toString();
        for (int r = 0; r < n; ++r) {
          std::vector<float> out(count);
          ASSERT_TRUE(loadFrom(out.data(), bufs[r].data(), count, dtype).isOk());
          got[codec].push_back(std::move(out));
          crossed[codec] += w.comms[r]->stats().interNodeBytesSent;
        }
      }
      const bool oneNode = std::string(topo) == "1x2";
      const double bound = dtype == DataType::kFloat32 ? 0.05 : 0.25;
      double worst = 0;
      for (size_t r = 0; r < got["int8"].size(); ++r) {
        ASSERT_EQ(got["int8"][r], got["int8"][0]) << "rank " << r;  // the same bits everywhere
        if (oneNode) EXPECT_EQ(got["int8"][r], got["none"][r]) << "rank " << r;  // lossless
      }
      for (size_t i = 0; i < count; ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(got["int8"][0][i]) - want[i]));
      }
      EXPECT_LT(worst, bound);
      if (oneNode) {
        EXPECT_EQ(crossed["int8"], 0u);
      } else {
        EXPECT_GT(worst, 0);
        EXPECT_GT(crossed["int8"], 0u);
        EXPECT_LT(crossed["int8"] * 100, crossed["none"] * (dtype == DataType::kFloat32 ? 35 : 70));
      }
    }
  }
}

// allreduce_compressed on device memory (DeviceCall::compression) with a host residual: error
// feedback. The same inputs K times: without a residual each call loses the same rounding, so
// the running sum drifts K times one call's error; with it, what a call drops the next one
// sends, and the running sum stays within about one call's error.
TEST(DeviceCompressed, ErrorFeedbackKeepsTheRunningSumClose) {
  const size_t count = 100003;
  const int calls = 16;
  for (const char* topo : {"2x1", "2x2"}) {
    SCOPED_TRACE(topo);
    double drift[2] = {0, 0};  // without, with a residual
    for (int feedback = 0; feedback < 2; ++feedback) {
      DeviceWorld w;
      ASSERT_TRUE(makeDeviceWorld(topo, &w, milliseconds(30000), "auto",
                                  std::chrono::microseconds(0))
                      .isOk());
      const int n = w.size();
      std::vector<std::vector<float>> x(n, std::vector<float>(count));
      std::vector<double> exact(count, 0.0), sum(count, 0.0);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
          x[r][i] = std::sin(static_cast<float>(i) * 0.37f + static_cast<float>(r)) * 0.3f;
          exact[i] += x[r][i];
        }
      }
      std::vector<std::vector<float>> residual(n, std::vector<float>(count, 0.0f));
      for (int k = 0; k < calls; ++k) {
        std::vector<std::vector<float>> buf = x;
        std::vector<std::shared_ptr<Task>> tasks;
        for (int r = 0; r < n; ++r) {
          auto request = std::make_shared<CompressionRequest>();
          request->codec = "int4";
          request->residual = feedback ? residual[r].data() : nullptr;
          DeviceCall call;
          call.recv = buf[r].data();
          call.count = count;
          call.device = w.devices[r];
          call.compression = request;
          tasks.push_back(w.comms[r]->deviceCall(call));
        }
        for (const Status& s : finishAll(w, tasks)) ASSERT_TRUE(s.isOk()) << s.toString();
        for (int r = 1; r < n; ++r) ASSERT_EQ(buf[r], buf[0]) << "rank " << r;
        for (size_t i = 0; i < count; ++i) sum[i] += buf[0][i];
      }
      for (size_t i = 0; i < count; ++i) {
        drift[feedback] = std::max(drift[feedback], std::fabs(sum[i] - calls * exact[i]));
      }
      if (feedback) {
        double held = 0;
        for (const auto& res : residual) {
          for (float v : res) held = std::max(held, static_cast<double>(std::fabs(v)));
        }
        EXPECT_GT(held, 0);  // the residuals hold what the last encodings dropped
      }
    }
    EXPECT_GT(drift[0], 0);
    EXPECT_LT(drift[1], 0.25 * drift[0]) << "without " << drift[0] << ", with " << drift[1];
  }
}

// A request on a call other than allreduce is an argument error on the rank that made it.
TEST(DeviceCompressed, RequestOnAnotherOpIsRejected) {
  DeviceWorld w;
  ASSERT_TRUE(makeDeviceWorld("2x1", &w).isOk());
  std::vector<float> buf(64, 1.0f);
  DeviceCall call;
  call.op = OpType::kBroadcast;
  call.recv = buf.data();
  call.count = buf.size();
  call.device = w.devices[0];
  call.compression = std::make_shared<CompressionRequest>();
  const Status s = w.comms[0]->deviceCall(call)->wait(Deadline::after(milliseconds(5000)));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  call.op = OpType::kAllreduce;
  call.dtype = DataType::kInt32;  // compressed allreduce takes floating point
  const Status t = w.comms[0]->deviceCall(call)->wait(Deadline::after(milliseconds(5000)));
  EXPECT_EQ(t.code(), StatusCode::kInvalidArgument) << t.toString();
}

// Work queued on the device before the call (a kernel writing the gradients) is what the call
// reads: the device's queue runs the call after it.
TEST(DeviceCalls, ReadInputsQueuedBeforeThem) {
  for (const char* topo : {"1x2", "2x1", "2x2"}) {
    SCOPED_TRACE(topo);
    DeviceWorld w;
    ASSERT_TRUE(makeDeviceWorld(topo, &w, milliseconds(20000), "auto", std::chrono::microseconds(0)).isOk());
    const int n = w.size();
    std::vector<std::vector<float>> bufs(n, std::vector<float>(5000, 0.0f));
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      float* p = bufs[r].data();
      ASSERT_TRUE(w.devices[r]
                      ->enqueue([p, r] {
                        std::this_thread::sleep_for(milliseconds(50));  // a slow kernel
                        std::fill(p, p + 5000, static_cast<float>(r + 1));
                      })
                      .isOk());
      DeviceCall call;
      call.recv = p;
      call.count = 5000;
      call.device = w.devices[r];
      Result<std::shared_ptr<Fence>> at = w.devices[r]->record();
      ASSERT_TRUE(at.isOk());
      call.after = at.value();
      tasks.push_back(w.comms[r]->deviceCall(call));
    }
    for (const Status& s : finishAll(w, tasks)) ASSERT_TRUE(s.isOk()) << s.toString();
    const float want = static_cast<float>(n * (n + 1) / 2);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(std::count(bufs[r].begin(), bufs[r].end(), want), 5000) << "rank " << r;
    }
  }
}

int openSockets() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    char target[256] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t len = readlink(path.c_str(), target, sizeof(target) - 1);
    if (len > 0 && std::strncmp(target, "socket:", 7) == 0) ++n;
  }
  closedir(d);
  return n;
}

// The device rows move their inter-node bytes on the communicator's own transports: no
// connection, no handshake of their own.
TEST(DeviceCalls, OpenNoConnectionOfTheirOwn) {
  DeviceWorld w;
  ASSERT_TRUE(makeDeviceWorld("2x2", &w).isOk());
  const int n = w.size();
  std::vector<std::vector<float>> bufs = rankValues(n, 100000);
  expectAllOk(allreduceOnDevices(w, bufs));  // host calls' buffers: any warm-up they need
  const int before = openSockets();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 3; ++i) {
    std::vector<std::vector<float>> b = rankValues(n, 100000);
    for (const Status& s : finishAll(w, allreduceOnDevices(w, b))) ASSERT_TRUE(s.isOk());
    std::vector<std::shared_ptr<Task>> tasks;
    std::vector<std::vector<float>> out(n, std::vector<float>(4 * 100));
    for (int r = 0; r < n; ++r) {
      DeviceCall call;
      call.op = OpType::kAllgather;
      call.send = b[r].data();
      call.recv = out[r].data();
      call.count = 100;
      call.device = w.devices[r];
      tasks.push_back(w.comms[r]->deviceCall(call));
    }
    for (const Status& s : finishAll(w, tasks)) ASSERT_TRUE(s.isOk());
  }
  EXPECT_EQ(openSockets(), before);
}

// Forced algorithm names: a device row's name runs it, a host row's name leaves device calls on
// auto, a device row that cannot run the call is an argument error saying why.
TEST(DeviceCalls, FollowForcedAlgorithmNames) {
  {
    DeviceWorld w;
    ASSERT_TRUE(makeDeviceWorld("2x2", &w, milliseconds(20000), "ring").isOk());
    std::vector<std::vector<float>> bufs = rankValues(w.size(), 1000);
    for (const Status& s : finishAll(w, allreduceOnDevices(w, bufs))) EXPECT_TRUE(s.isOk());
  }
  DeviceWorld w;
  ASSERT_TRUE(makeDeviceWorld("2x2", &w, milliseconds(20000), "device_node").isOk());
  std::vector<std::vector<float>> bufs = rankValues(w.size(), 1000);
  for (const Status& s : waitAll(allreduceOnDevices(w, bufs))) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
    EXPECT_NE(s.message().find("device_node is one node's stage"), std::string::npos) << s.toString();
  }
}

// Argument errors fail that call on that rank, nothing else: the next calls run.
TEST(DeviceCalls, RejectBadArguments) {
  DeviceWorld w;
  ASSERT_TRUE(makeDeviceWorld("1x2", &w).isOk());
  std::vector<float> buf(8, 1.0f);
  auto expectInvalid = [&](DeviceCall call, const std::string& says) {
    const Status s = w.comms[0]->deviceCall(call)->wait(Deadline::after(milliseconds(5000)));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
    EXPECT_NE(s.message().find(says), std::string::npos) << s.toString();
  };
  DeviceCall good;
  good.recv = buf.data();
  good.count = buf.size();
  good.device = w.devices[0];
  DeviceCall c = good;
  c.device = nullptr;
  expectInvalid(c, "without a device");
  c = good;
  c.op = OpType::kAlltoall;
  expectInvalid(c, "not a collective on device memory");
  c = good;
  c.op = OpType::kBroadcast;
  c.root = 2;
  expectInvalid(c, "root 2");
  c = good;
  c.recv = nullptr;
  expectInvalid(c, "null receive buffer");
  c = good;
  c.redop = ReduceOp::kBand;
  expectInvalid(c, "band");
  std::vector<std::vector<float>> bufs = rankValues(2, 8);
  for (const Status& s : finishAll(w, allreduceOnDevices(w, bufs))) EXPECT_TRUE(s.isOk()) << s.toString();
  EXPECT_EQ(bufs[0][0], 3000.0f);
}

// ---- Failures: a clear error on every rank, within the timeout ------------------------------

void expectAllFailedWithin(const std::vector<Status>& st, std::chrono::steady_clock::time_point start,
                           milliseconds limit) {
  for (size_t r = 0; r < st.size(); ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    EXPECT_FALSE(st[r].message().empty()) << "rank " << r;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, limit);
}

// A rank calling on host memory where the others call on device memory: kMismatch, not a hang
// or mixed bytes.
TEST(DeviceFailure, HostAndDeviceCallsMismatch) {
  DeviceWorld w;
  ASSERT_TRUE(makeDeviceWorld("2x1", &w, milliseconds(5000)).isOk());
  std::vector<std::vector<float>> bufs = rankValues(2, 1000);
  DeviceCall call;
  call.recv = bufs[0].data();
  call.count = 1000;
  call.device = w.devices[0];
  std::vector<std::shared_ptr<Task>> tasks = {
      w.comms[0]->deviceCall(call),
      w.comms[1]->allreduce(bufs[1].data(), 1000, DataType::kFloat32, ReduceOp::kSum)};
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Status> st = waitAll(tasks);
  expectAllFailedWithin(st, start, milliseconds(20000));
  bool mismatch = false;
  for (const Status& s : st) mismatch = mismatch || s.code() == StatusCode::kMismatch;
  EXPECT_TRUE(mismatch) << st[0].toString() << " | " << st[1].toString();
}

// Device calls of different sizes: kMismatch on the ranks, the communicator failed on all.
TEST(DeviceFailure, MismatchedCountsFailEveryRank) {
  DeviceWorld w;
  ASSERT_TRUE(makeDeviceWorld("2x2", &w, milliseconds(5000)).isOk());
  std::vector<std::vector<float>> bufs = rankValues(4, 1000);
  bufs[3].resize(999);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Status> st = waitAll(allreduceOnDevices(w, bufs));
  expectAllFailedWithin(st, start, milliseconds(20000));
}

// A peer dies while the others are in the cross-node stage (its device never delivers its copy
// to the host, then the rank is gone): every other rank fails within the timeout.
TEST(DeviceFailure, PeerKilledMidStage) {
  DeviceWorld w;
  ASSERT_TRUE(makeDeviceWorld("2x2", &w, milliseconds(8000)).isOk());
  std::vector<std::vector<float>> bufs = rankValues(4, 200000);
  w.devices[3]->hold(true);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<Task>> tasks = allreduceOnDevices(w, bufs);
  for (auto& c : w.comms) c->handOver();
  ASSERT_TRUE(waitUntilSending(w.comms, 3));  // ranks 0-2 are past their node stage
  w.comms[3]->abort(abortedError("rank 3 was killed"));
  const std::vector<Status> st = waitAll(tasks);
  expectAllFailedWithin(st, start, milliseconds(20000));
  w.devices[3]->hold(false);
}

// abort() while a staged copy is pending (the device holds it): the call fails at once on that
// rank, and on its peers within the timeout; the device is aborted with the communicator.
TEST(DeviceFailure, AbortDuringStagedCopy) {
  DeviceWorld w;
  ASSERT_TRUE(makeDeviceWorld("2x1", &w, milliseconds(8000)).isOk());
  std::vector<std::vector<float>> bufs = rankValues(2, 100000);
  w.devices[0]->hold(true);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<Task>> tasks = allreduceOnDevices(w, bufs);
  for (auto& c : w.comms) c->handOver();
  std::this_thread::sleep_for(milliseconds(100));
  w.comms[0]->abort(abortedError("aborted by the test"));
  const std::vector<Status> st = waitAll(tasks);
  expectAllFailedWithin(st, start, milliseconds(6000));  // well before the timeout
  Result<std::shared_ptr<Fence>> f = w.devices[0]->record();
  EXPECT_FALSE(f.isOk()) << "the device was not aborted with the communicator";
}

// A device that stalls before the call's inputs reach the host: the call fails with kTimeout at
// its deadline, on every rank.
TEST(DeviceFailure, StalledDeviceTimesOut) {
  DeviceWorld w;
  ASSERT_TRUE(makeDeviceWorld("2x1", &w, milliseconds(1500)).isOk());
  std::vector<std::vector<float>> bufs = rankValues(2, 1000);
  w.devices[1]->hold(true);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Status> st = waitAll(allreduceOnDevices(w, bufs));
  expectAllFailedWithin(st, start, milliseconds(15000));
  EXPECT_EQ(st[1].code(), StatusCode::kTimeout) << st[1].toString();
  w.devices[1]->hold(false);
}

// A call whose host stages are over but whose device work never ends (the device stalls after
// them): the watchdog fails the communicator at the call's deadline and aborts the device, so
// the end fence reports the error instead of never passing, and later calls fail.
TEST(DeviceFailure, WatchdogEndsStalledDeviceWork) {
  DeviceWorld w;
  ASSERT_TRUE(makeDeviceWorld("2x1", &w, milliseconds(1500)).isOk());
  std::vector<std::vector<float>> bufs = rankValues(2, 1000);
  // Rank 1 only receives the broadcast: its one device operation is the copy back, queued at
  // the call's end, which the held device never runs.
  w.devices[1]->hold(true);
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 2; ++r) {
    DeviceCall call;
    call.op = OpType::kBroadcast;
    call.root = 0;
    call.recv = bufs[r].data();
    call.count = 1000;
    call.device = w.devices[r];
    tasks.push_back(w.comms[r]->deviceCall(call));
  }
  const std::vector<Status> st = waitAll(tasks);
  ASSERT_TRUE(st[1].isOk()) << st[1].toString();
  const auto start = std::chrono::steady_clock::now();
  const Status end = waitFence(*w.devices[1], *tasks[1]->deviceEnd(),
                               Deadline::after(milliseconds(20000)), "the broadcast's copy back");
  EXPECT_FALSE(end.isOk());
  EXPECT_NE(end.message().find("did not end within the timeout"), std::string::npos)
      << end.toString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(15000));
  const Status later = waitAll(allreduceOnDevices(w, bufs))[1];
  EXPECT_FALSE(later.isOk());
  w.devices[1]->hold(false);
}

}  // namespace
}  // namespace nanoccl::colltest
