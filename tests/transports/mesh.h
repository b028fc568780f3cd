// Test helpers: a mesh of transports (tcp unless named), one per rank, all in this process
// (ranks as threads, addresses exchanged in memory).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transports/tcp/io_engine.h"
#include "transports/transport.h"

namespace nanoccl::testing {

inline Config loopbackConfig(const std::string& engine, int nsocks = 2) {
  Config c;
  c.socketIfname = "lo";
  c.tcpEngine = engine;
  c.nsocks = nsocks;
  c.stripeMinBytes = 64 * 1024;
  return c;
}

inline TransportOptions optionsFor(int rank, int size, const Config& cfg,
                                   const std::string& secret = "test-secret") {
  TransportOptions o;
  o.rank = rank;
  o.size = size;
  o.commId = "test-comm";
  o.secret = secret;
  o.config = cfg;
  return o;
}

// Creates and connects `size` transports of the table's row `transport` (tcp unless named);
// each rank's Config comes from `configFor(rank)`, and `tweak(rank, options)` may change the
// rest of its options (its secret, its comm id). Setup gets `setupSeconds`.
template <typename ConfigFor>
std::vector<std::unique_ptr<Transport>> makeMesh(
    int size, ConfigFor configFor, std::vector<Status>* statuses = nullptr,
    const std::string& transport = "tcp",
    const std::function<void(int, TransportOptions&)>& tweak = {}, int setupSeconds = 20) {
  std::vector<std::unique_ptr<Transport>> ts(static_cast<size_t>(size));
  std::vector<std::string> addrs(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    TransportOptions o = optionsFor(r, size, configFor(r));
    if (tweak) tweak(r, o);
    auto t = createTransport(transport, o);
    EXPECT_TRUE(t.isOk()) << t.status().toString();
    if (!t.isOk()) return {};
    ts[r] = std::move(t).value();
    auto a = ts[r]->listen();
    EXPECT_TRUE(a.isOk()) << a.status().toString();
    addrs[r] = a.isOk() ? a.value() : "";
  }
  std::vector<std::future<Status>> done;
  for (int r = 0; r < size; ++r) {
    done.push_back(std::async(std::launch::async, [&, r] {
      return ts[r]->connect(addrs, Deadline::after(std::chrono::seconds(setupSeconds)));
    }));
  }
  bool ok = true;
  for (int r = 0; r < size; ++r) {
    const Status st = done[r].get();
    if (statuses) statuses->push_back(st);
    ok = ok && st.isOk();
    if (!statuses) {
      EXPECT_TRUE(st.isOk()) << st.toString();
    }
  }
  if (!ok && !statuses) return {};
  return ts;
}

inline std::vector<std::unique_ptr<Transport>> makeMesh(int size, const Config& cfg) {
  return makeMesh(size, [&](int) { return cfg; });
}

inline Envelope collectiveEnvelope(uint64_t seq, uint32_t tag, uint64_t count = 0,
                                   OpType op = OpType::kAllreduce,
                                   DataType dtype = DataType::kUInt8) {
  Envelope e;
  e.fingerprint.op = op;
  e.fingerprint.dtype = dtype;
  e.fingerprint.count = count;
  e.fingerprint.seq = seq;
  e.tag = tag;
  return e;
}

inline Envelope p2pEnvelope(uint32_t tag, uint64_t count, DataType dtype = DataType::kUInt8) {
  Envelope e;
  e.fingerprint.op = OpType::kSendRecv;
  e.fingerprint.dtype = dtype;
  e.fingerprint.count = count;
  e.tag = tag;
  return e;
}

// Fast, seed-dependent bytes (tens of MB must not make the suite slow).
inline std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&v[i], &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<uint8_t>(x >> (8 * (i % 8)));
  return v;
}

inline Deadline soon(int seconds = 10) { return Deadline::after(std::chrono::seconds(seconds)); }

// Waits until `t` has seen `connections` of `peer`'s connections close in order (the state a
// test wants to reach after the peer left), or the deadline; returns whether it did.
inline bool waitUntilClosedBy(const Transport& t, int peer, uint64_t connections,
                              const Deadline& deadline = soon()) {
  while (t.counters()[static_cast<size_t>(peer)].connectionsClosed < connections) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The engines this machine can run: epoll always, uring when the probe passes.
inline std::vector<std::string> engines() {
  std::vector<std::string> out = {"epoll"};
  if (tcp::probeUring().isOk()) out.push_back("uring");
  return out;
}

inline void skipIfUnavailable(const std::string& engine) {
  if (engine == "uring") {
    const Status st = tcp::probeUring();
    if (!st.isOk()) GTEST_SKIP() << "io_uring unavailable: " << st.message();
  }
}

}  // namespace nanoccl::testing
