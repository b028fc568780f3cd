// Test helpers for the collectives: a world of communicators in this process (ranks as
// threads over one InMemoryStore), typed element access, deterministic inputs and a reference
// reduction computed independently of the library's kernels.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store.h"

namespace nanoccl::colltest {

using Value = std::complex<double>;

struct WorldOptions {
  int size = 2;
  std::string engine = "epoll";
  std::string algo = "auto";
  size_t chunkBytes = 0;  // 0: the default
  std::chrono::milliseconds timeout{10000};
  // Emulated topology: rank r's node id (empty: every rank derives the same one, one node).
  std::vector<std::string> nodeIds;
  std::string intraTransport = "auto";
  // NANOCCL_COMPRESSION and friends (the defaults: lossless).
  std::string compression = "none";
  size_t compressionMinBytes = 0;
  int compressionBlock = 0;
  int spinUs = -1;  // NANOCCL_SPIN_US; -1: the default
  // Fault injection: wraps each transport rank r creates (CommunicatorOptions::wrapTransport).
  std::function<std::unique_ptr<Transport>(int rank, std::unique_ptr<Transport>)> wrapTransport;
  // Last changes to rank r's Config (settings that differ per rank, or that no field above has).
  std::function<void(int rank, Config&)> configure;
};

inline Config worldConfig(const WorldOptions& o) {
  Config c;
  c.socketIfname = "lo";
  c.tcpEngine = o.engine;
  c.algo = o.algo;
  if (o.chunkBytes != 0) c.chunkBytes = o.chunkBytes;
  c.intraTransport = o.intraTransport;
  c.compression = o.compression;
  c.compressionMinBytes = o.compressionMinBytes;
  c.compressionBlock = o.compressionBlock;
  if (o.spinUs >= 0) c.spinUs = o.spinUs;
  return c;
}

// Creates one communicator per rank, each from its own thread (create() blocks until every
// rank has joined): what each rank's create() returned.
inline std::vector<Result<std::shared_ptr<Communicator>>> createEach(
    const WorldOptions& o, std::shared_ptr<Store> store = nullptr) {
  static std::atomic<int> worldCounter{0};
  if (!store) store = std::make_shared<InMemoryStore>();
  const std::string commId = "world" + std::to_string(worldCounter.fetch_add(1));
  std::vector<Result<std::shared_ptr<Communicator>>> results(
      o.size, Result<std::shared_ptr<Communicator>>(Status()));
  std::vector<std::thread> threads;
  for (int r = 0; r < o.size; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions co;
      co.rank = r;
      co.size = o.size;
      co.store = store;
      co.commId = commId;
      co.config = worldConfig(o);
      if (o.configure) o.configure(r, co.config);
      co.timeout = o.timeout;
      if (!o.nodeIds.empty()) co.nodeId = o.nodeIds[r];
      if (o.wrapTransport) {
        co.wrapTransport = [wrap = o.wrapTransport, r](std::unique_ptr<Transport> t) {
          return wrap(r, std::move(t));
        };
      }
      results[r] = Communicator::create(co);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// createEach(); on failure returns the first failed rank's Status.
inline Status makeWorld(const WorldOptions& o, std::vector<std::shared_ptr<Communicator>>* out,
                        std::shared_ptr<Store> store = nullptr) {
  std::vector<Result<std::shared_ptr<Communicator>>> results = createEach(o, std::move(store));
  out->clear();
  for (int r = 0; r < o.size; ++r) {
    if (!results[r].isOk()) {
      out->clear();
      return results[r].status();
    }
    out->push_back(results[r].value());
  }
  return Status::ok();
}

// Makes a world or skips the test where the requested engine is not available here.
#define NANOCCL_MAKE_WORLD_OR_SKIP(options, comms)                                           \
  do {                                                                                       \
    const ::nanoccl::Status world_status_ = ::nanoccl::colltest::makeWorld(options, &comms); \
    if (world_status_.code() == ::nanoccl::StatusCode::kUnavailable) {                       \
      GTEST_SKIP() << "not available here: " << world_status_.toString();                    \
    }                                                                                        \
    ASSERT_TRUE(world_status_.isOk()) << world_status_.toString();                           \
  } while (0)

// Payload bytes this communicator has sent so far, to every peer and over every transport.
inline uint64_t bytesSent(const Communicator& c) {
  uint64_t n = 0;
  for (const PeerCounters& p : c.stats().perPeer) n += p.bytesSent;
  return n;
}

// Waits (at most `limit`) until each of `comms[0..n)` has sent payload: their calls are then
// running, not merely queued. Tests that act "mid-collective" use this instead of a sleep, so
// that a loaded machine makes them slower, never vacuous. False on timeout.
inline bool waitUntilSending(const std::vector<std::shared_ptr<Communicator>>& comms, int n,
                             std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (int r = 0; r < n; ++r) {
    while (bytesSent(*comms[r]) == 0) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::yield();
    }
  }
  return true;
}

// Waits for every task; a task that does not finish within `limit` is a test failure (the
// communicator's own timeout should have failed it long before).
inline std::vector<Status> waitAll(const std::vector<std::shared_ptr<Task>>& tasks,
                                   std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  std::vector<Status> out;
  const Deadline deadline = Deadline::after(limit);
  for (const auto& t : tasks) out.push_back(t->wait(deadline));
  return out;
}

inline void expectAllOk(const std::vector<std::shared_ptr<Task>>& tasks) {
  const std::vector<Status> st = waitAll(tasks);
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].isOk()) << "rank " << r << ": " << st[r].toString();
}

// ---- Typed element access ----

inline Value readValue(DataType t, const void* buf, size_t i) {
  const char* p = static_cast<const char*>(buf) + i * dataTypeSize(t);
  auto load = [p](auto zero) {
    decltype(zero) v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (t) {
    case DataType::kFloat32:
      return load(float{});
    case DataType::kFloat64:
      return load(double{});
    case DataType::kFloat16:
      return halfToFloat(load(uint16_t{}));
    case DataType::kBFloat16:
      return bfloat16ToFloat(load(uint16_t{}));
    case DataType::kInt8:
      return static_cast<double>(load(int8_t{}));
    case DataType::kUInt8:
      return static_cast<double>(load(uint8_t{}));
    case DataType::kInt16:
      return static_cast<double>(load(int16_t{}));
    case DataType::kInt32:
      return static_cast<double>(load(int32_t{}));
    case DataType::kInt64:
      return static_cast<double>(load(int64_t{}));
    case DataType::kBool:
      return load(uint8_t{}) != 0 ? 1.0 : 0.0;
    case DataType::kComplex64: {
      float v[2];
      std::memcpy(v, p, sizeof(v));
      return {v[0], v[1]};
    }
    case DataType::kComplex128: {
      double v[2];
      std::memcpy(v, p, sizeof(v));
      return {v[0], v[1]};
    }
    default:
      return 0;
  }
}

inline void writeValue(DataType t, void* buf, size_t i, Value v) {
  char* p = static_cast<char*>(buf) + i * dataTypeSize(t);
  auto store = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
  const double re = v.real();
  switch (t) {
    case DataType::kFloat32:
      store(static_cast<float>(re));
      break;
    case DataType::kFloat64:
      store(re);
      break;
    case DataType::kFloat16:
      store(floatToHalf(static_cast<float>(re)));
      break;
    case DataType::kBFloat16:
      store(floatToBFloat16(static_cast<float>(re)));
      break;
    case DataType::kInt8:
      store(static_cast<int8_t>(static_cast<int64_t>(re)));
      break;
    case DataType::kUInt8:
      store(static_cast<uint8_t>(static_cast<int64_t>(re)));
      break;
    case DataType::kInt16:
      store(static_cast<int16_t>(static_cast<int64_t>(re)));
      break;
    case DataType::kInt32:
      store(static_cast<int32_t>(static_cast<int64_t>(re)));
      break;
    case DataType::kInt64:
      store(static_cast<int64_t>(re));
      break;
    case DataType::kBool:
      store(static_cast<uint8_t>(re != 0 ? 1 : 0));
      break;
    case DataType::kComplex64: {
      const float x[2] = {static_cast<float>(re), static_cast<float>(v.imag())};
      std::memcpy(p, x, sizeof(x));
      break;
    }
    case DataType::kComplex128: {
      const double x[2] = {re, v.imag()};
      std::memcpy(p, x, sizeof(x));
      break;
    }
    default:
      break;
  }
}

inline bool isUnsigned(DataType t) { return t == DataType::kUInt8 || t == DataType::kBool; }
inline bool isIntegral(DataType t) { return !isFloatingPoint(t) && !isComplex(t); }

// ---- Inputs and the reference ----

// Small values whose sums and products stay exact in every type (bfloat16 included) and never
// overflow int8 over 8 ranks, so integer results are exact and float ones nearly so.
inline Value inputValue(DataType t, ReduceOp op, int rank, size_t i) {
  const int k = static_cast<int>((static_cast<size_t>(rank) * 7 + i * 3 + 1) % 11);  // 0..10
  if (t == DataType::kBool) return ((rank * 5 + static_cast<int>(i % 1000)) % 4) != 0 ? 1 : 0;
  if (op == ReduceOp::kProduct) {
    if (isComplex(t)) return k % 3 == 0 ? Value(1, 1) : k % 3 == 1 ? Value(0, 1) : Value(1, 0);
    switch (k % 4) {
      case 0:
        return 2;
      case 1:
        return isUnsigned(t) ? 1 : -1;
      case 2:
        return 1;
      default:
        return isFloatingPoint(t) ? 0.5 : 1;
    }
  }
  if (isUnsigned(t)) return k;
  if (isComplex(t)) return Value(k - 5, (rank + static_cast<int>(i % 7)) % 3 - 1);
  if (isFloatingPoint(t)) return (k - 5) * 0.5;
  return k - 5;
}

// The value after kPremulSum's local scaling (integers round toward zero, as the kernels do).
inline Value premultiply(DataType t, Value v, double factor) {
  if (isIntegral(t)) return std::trunc(v.real() * factor);
  return v * factor;
}

inline Value combine(DataType t, ReduceOp op, Value a, Value b) {
  if (t == DataType::kBool) {
    const bool x = a.real() != 0;
    const bool y = b.real() != 0;
    switch (op) {
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
      case ReduceOp::kBand:
        return x && y;
      case ReduceOp::kBxor:
        return x != y;
      default:
        return x || y;
    }
  }
  switch (op) {
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a.real(), b.real());
    case ReduceOp::kMax:
      return std::max(a.real(), b.real());
    case ReduceOp::kBand:
      return static_cast<double>(static_cast<int64_t>(a.real()) & static_cast<int64_t>(b.real()));
    case ReduceOp::kBor:
      return static_cast<double>(static_cast<int64_t>(a.real()) | static_cast<int64_t>(b.real()));
    case ReduceOp::kBxor:
      return static_cast<double>(static_cast<int64_t>(a.real()) ^ static_cast<int64_t>(b.real()));
    default:
      return a + b;
  }
}

constexpr double kPremulFactor = 0.5;

// The reduction over `size` ranks of element i, where rank r contributes input(r).
inline Value referenceReduce(DataType t, ReduceOp op, int size,
                             const std::function<Value(int)>& input) {
  auto in = [&](int r) {
    return op == ReduceOp::kPremulSum ? premultiply(t, input(r), kPremulFactor) : input(r);
  };
  Value acc = in(0);
  for (int r = 1; r < size; ++r) acc = combine(t, op, acc, in(r));
  if (op == ReduceOp::kAvg) {
    if (isIntegral(t)) return std::trunc(acc.real() / size);
    return acc / static_cast<double>(size);
  }
  return acc;
}

// Whether `got` (read back from a buffer of type t) matches the reference `want`.
inline bool closeEnough(DataType t, Value got, Value want) {
  if (isIntegral(t)) {
    // Round the reference through the type first (wrap-around, bool), then compare exactly.
    char tmp[16];
    writeValue(t, tmp, 0, want);
    return got == readValue(t, tmp, 0);
  }
  double rtol = 1e-5, atol = 1e-5;
  if (t == DataType::kFloat64 || t == DataType::kComplex128) rtol = atol = 1e-12;
  if (t == DataType::kFloat16 || t == DataType::kBFloat16) rtol = atol = 1e-2;
  return std::abs(got - want) <= atol + rtol * std::abs(want);
}

// Checks count elements of `buf` against want(i); reports the first few differences only.
inline void expectBuffer(DataType t, const void* buf, size_t count,
                         const std::function<Value(size_t)>& want, const std::string& where) {
  int reported = 0;
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    const Value got = readValue(t, buf, i);
    const Value w = want(i);
    if (!closeEnough(t, got, w)) {
      ++bad;
      if (reported++ < 5) {
        ADD_FAILURE() << where << ": element " << i << " is " << got << ", expected " << w;
      }
    }
  }
  if (bad > 5) ADD_FAILURE() << where << ": " << bad << " of " << count << " elements differ";
}

// A typed buffer of `count` elements filled by fill(i).
inline std::vector<char> makeBuffer(DataType t, size_t count,
                                    const std::function<Value(size_t)>& fill) {
  std::vector<char> b(std::max<size_t>(count, 1) * dataTypeSize(t));
  for (size_t i = 0; i < count; ++i) writeValue(t, b.data(), i, fill(i));
  return b;
}

// ---- The dtype x reduction matrix ----

inline std::vector<DataType> allDataTypes() {
  std::vector<DataType> out;
  for (int i = 0; i < static_cast<int>(DataType::kNumTypes); ++i)
    out.push_back(static_cast<DataType>(i));
  return out;
}

// Whether the tests exercise (op, t): what reduceOpSupported allows, minus avg and premul on
// bool, which torch does not offer and whose meaning is not pinned down.
inline bool testedReduction(ReduceOp op, DataType t) {
  if (!reduceOpSupported(op, t)) return false;
  if (t == DataType::kBool && (op == ReduceOp::kAvg || op == ReduceOp::kPremulSum)) return false;
  return true;
}

struct Combo {
  DataType dtype;
  ReduceOp op;
};

// Every tested (dtype, reduction) pair, or a handful that covers each kernel family.
inline std::vector<Combo> reductionCombos(bool full) {
  std::vector<Combo> out;
  if (full) {
    for (DataType t : allDataTypes()) {
      for (int o = 0; o < static_cast<int>(ReduceOp::kNumOps); ++o) {
        if (testedReduction(static_cast<ReduceOp>(o), t))
          out.push_back({t, static_cast<ReduceOp>(o)});
      }
    }
    return out;
  }
  return {{DataType::kFloat32, ReduceOp::kSum},   {DataType::kInt32, ReduceOp::kMax},
          {DataType::kBFloat16, ReduceOp::kAvg},  {DataType::kFloat64, ReduceOp::kPremulSum},
          {DataType::kInt64, ReduceOp::kProduct}, {DataType::kUInt8, ReduceOp::kBxor},
          {DataType::kComplex64, ReduceOp::kSum}};
}

// ---- Parameters shared by the suites ----

struct Case {
  std::string engine = "epoll";
  int size = 2;
  size_t count = 0;
  std::string algo = "auto";
  size_t chunkBytes = 0;
  bool full = false;  // the full dtype x reduction matrix, else a few pairs
};

inline std::string caseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s =
      c.engine + "_n" + std::to_string(c.size) + "_c" + std::to_string(c.count) + "_" + c.algo;
  if (c.chunkBytes) s += "_chunk" + std::to_string(c.chunkBytes);
  if (c.full) s += "_full";
  return s;
}

inline WorldOptions worldFor(const Case& c) {
  WorldOptions o;
  o.size = c.size;
  o.engine = c.engine;
  o.algo = c.algo;
  o.chunkBytes = c.chunkBytes;
  // Ranks of one node route collectives over shm (transports/routed); keep TCP under test too:
  // the uring half of the matrix runs over TCP (both engines are covered by the transport
  // suites and the hierarchical suites' inter-node stages).
  o.intraTransport = c.engine == "uring" ? "tcp" : "auto";
  return o;
}

// The standard matrix: both engines x world sizes 1-8 x counts 0, 1, 1023 (full dtype matrix
// at sizes 2-3), several-MB counts on a few world sizes, and each algorithm forced.
inline std::vector<Case> standardCases(const std::vector<std::string>& algos, size_t largeCount) {
  std::vector<Case> out;
  for (const std::string engine : {"epoll", "uring"}) {
    for (int size : {1, 2, 3, 4, 5, 8}) {
      const bool small = size == 2 || size == 3;
      for (size_t count : {size_t{0}, size_t{1}, size_t{1023}}) {
        if (count == 1 && !small) continue;
        out.push_back({engine, size, count, "auto", 0, small && count != 0});
      }
    }
    for (int size : {2, 3}) out.push_back({engine, size, largeCount, "auto", 0, false});
  }
  out.push_back({"epoll", 4, largeCount, "auto", 0, false});
  for (const std::string& algo : algos) {
    for (int size : {2, 3, 5}) {
      out.push_back({"epoll", size, 1023, algo, 0, size == 3});
      out.push_back({"epoll", size, 1, algo, 0, false});
    }
    // Many small chunks: exercises the pipelining and the receive window.
    out.push_back({"uring", 4, 40000, algo, 1024, false});
  }
  return out;
}

// Large counts check a few pairs only: the point there is the chunked pipeline, not the kernels.
inline std::vector<Combo> combosFor(const Case& c) {
  if (c.count > 100000) {
    return {{DataType::kFloat32, ReduceOp::kSum},
            {DataType::kInt32, ReduceOp::kMax},
            {DataType::kBFloat16, ReduceOp::kAvg}};
  }
  return reductionCombos(c.full);
}

// Data types for the ops without a reduction.
inline std::vector<DataType> dataTypesFor(const Case& c) {
  if (c.count > 100000) return {DataType::kFloat32, DataType::kInt8};
  if (c.full) return allDataTypes();
  return {DataType::kFloat32, DataType::kInt64, DataType::kBFloat16, DataType::kComplex128,
          DataType::kBool};
}

constexpr size_t kLargeCount = (size_t{1} << 20) + 3;  // 4 MB of float32

inline std::string comboName(const Combo& c) {
  return std::string(dataTypeName(c.dtype)) + " " + reduceOpName(c.op);
}

}  // namespace nanoccl::colltest
