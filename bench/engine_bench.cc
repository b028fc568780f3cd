// TCP engines on loopback: stream throughput and ping-pong latency of the transport on each
// engine, against a plain blocking-socket stream measured in the same run. The `vs_blocking`
// counter is engine throughput / blocking throughput at the same message size (1.0 = equal).
// Ping-pong rows: tcp on each engine and shm, each with the default NANOCCL_SPIN_US and with
// 0 (every wait sleeps at once), in the same run; `round_trip_us` is one 8-byte round trip.
//
//   build/bench/nanoccl_bench_engine --benchmark_min_time=0.5
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstring>
#include <semaphore>
#include <future>
#include <map>
#include <thread>
#include <vector>

#include "transports/tcp/io_engine.h"
#include "transports/transport.h"

namespace nanoccl {
namespace {

constexpr int kInFlight = 4;  // messages kept in flight by the stream benchmarks

std::map<int64_t, double>& blockingBytesPerSecond() {
  static std::map<int64_t, double> m;
  return m;
}

// Two connected transports (rank 0 and rank 1) on loopback: "tcp" on `engine`, or "shm".
// spinUs < 0: the default NANOCCL_SPIN_US.
std::vector<std::unique_ptr<Transport>> pair(const std::string& engine, int nsocks,
                                             const std::string& kind = "tcp",
                                             int spinUs = -1) {
  Config c;
  c.socketIfname = "lo";
  c.tcpEngine = engine;
  c.nsocks = nsocks;
  if (spinUs >= 0) c.spinUs = spinUs;
  std::vector<std::unique_ptr<Transport>> ts(2);
  std::vector<std::string> addrs(2);
  for (int r = 0; r < 2; ++r) {
    TransportOptions o;
    o.rank = r;
    o.size = 2;
    o.commId = "bench";
    o.secret = "bench-secret";
    o.config = c;
    Result<std::unique_ptr<Transport>> t = createTransport(kind, o);
    if (!t.isOk()) return {};
    ts[r] = std::move(t).value();
    addrs[r] = ts[r]->listen().value();
  }
  auto f = std::async(std::launch::async, [&] {
    return ts[1]->connect(addrs, Deadline::after(std::chrono::seconds(20)));
  });
  if (!ts[0]->connect(addrs, Deadline::after(std::chrono::seconds(20))).isOk() ||
      !f.get().isOk()) {
    return {};
  }
  return ts;
}

Envelope envelope(uint64_t seq, uint64_t bytes, uint32_t tag = 0) {
  Envelope e;
  e.tag = tag;
  e.fingerprint.op = OpType::kBroadcast;
  e.fingerprint.count = bytes;
  e.fingerprint.seq = seq;
  return e;
}

void BM_BlockingStream(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  listen(lfd, 1);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  const int cfd = socket(AF_INET, SOCK_STREAM, 0);
  connect(cfd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  const int sfd = accept(lfd, nullptr, nullptr);
  const int one = 1;
  setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<char> out(bytes, 1), in(bytes);
  // One writer thread for the whole run (a thread per iteration would tax the baseline);
  // each iteration releases it for kInFlight messages and reads them on this thread.
  std::counting_semaphore<> go(0);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (true) {
      go.acquire();
      if (stop) return;
      for (int i = 0; i < kInFlight; ++i) {
        size_t off = 0;
        while (off < bytes) off += static_cast<size_t>(send(cfd, out.data() + off, bytes - off, 0));
      }
    }
  });
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    go.release();
    for (int i = 0; i < kInFlight; ++i) {
      size_t off = 0;
      while (off < bytes) off += static_cast<size_t>(recv(sfd, in.data() + off, bytes - off, 0));
    }
  }
  stop = true;
  go.release();
  writer.join();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kInFlight *
                          static_cast<int64_t>(bytes));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  blockingBytesPerSecond()[state.range(0)] =
      static_cast<double>(state.iterations()) * kInFlight * static_cast<double>(bytes) / secs;
  close(cfd);
  close(sfd);
  close(lfd);
}

void BM_EngineStream(benchmark::State& state, const std::string& engine, int nsocks,
                     const std::string& kind = "tcp") {
  if (kind == "tcp" && engine == "uring" && !tcp::probeUring().isOk()) {
    state.SkipWithError("io_uring unavailable");
    return;
  }
  const auto bytes = static_cast<size_t>(state.range(0));
  auto ts = pair(engine, nsocks, kind);
  if (ts.empty()) {
    state.SkipWithError("transport setup failed");
    return;
  }
  std::vector<std::vector<char>> out(kInFlight, std::vector<char>(bytes, 1));
  std::vector<std::vector<char>> in(kInFlight, std::vector<char>(bytes));
  uint64_t seq = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    ++seq;
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < kInFlight; ++i) {
      // One "call" per iteration, a tag per message in it.
      const auto tag = static_cast<uint32_t>(i);
      reqs.push_back(ts[1]->irecv(0, envelope(seq, bytes, tag), in[i].data(), bytes));
      reqs.push_back(ts[0]->isend(1, envelope(seq, bytes, tag), out[i].data(), bytes));
    }
    for (auto& r : reqs) {
      if (!r->wait(Deadline::after(std::chrono::seconds(30))).isOk()) {
        state.SkipWithError("transfer failed");
        return;
      }
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kInFlight *
                          static_cast<int64_t>(bytes));
  const auto base = blockingBytesPerSecond().find(state.range(0));
  if (base != blockingBytesPerSecond().end() && secs > 0) {
    const double mine = static_cast<double>(state.iterations()) * kInFlight *
                        static_cast<double>(bytes) / secs;
    state.counters["vs_blocking"] = mine / base->second;
  }
}

void BM_EnginePingPong(benchmark::State& state, const std::string& kind,
                       const std::string& engine, int spinUs) {
  if (kind == "tcp" && engine == "uring" && !tcp::probeUring().isOk()) {
    state.SkipWithError("io_uring unavailable");
    return;
  }
  auto ts = pair(engine, 1, kind, spinUs);
  if (ts.empty()) {
    state.SkipWithError("transport setup failed");
    return;
  }
  const auto bytes = static_cast<size_t>(state.range(0));
  std::vector<char> a(bytes, 1), b(bytes);
  uint64_t seq = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    ++seq;
    auto r1 = ts[1]->irecv(0, envelope(seq, bytes), b.data(), bytes);
    auto s0 = ts[0]->isend(1, envelope(seq, bytes), a.data(), bytes);
    if (!r1->wait(Deadline::after(std::chrono::seconds(10))).isOk()) break;
    const Envelope back = envelope(seq, bytes, 1);
    auto r0 = ts[0]->irecv(1, back, a.data(), bytes);
    auto s1 = ts[1]->isend(0, back, b.data(), bytes);
    if (!r0->wait(Deadline::after(std::chrono::seconds(10))).isOk()) break;
    s0->wait(Deadline::after(std::chrono::seconds(10))).isOk();
    s1->wait(Deadline::after(std::chrono::seconds(10))).isOk();
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  state.counters["round_trip_us"] = secs * 1e6 / static_cast<double>(state.iterations());
}

// The baseline must run before the engine rows that compare against it: registration order.
BENCHMARK(BM_BlockingStream)->RangeMultiplier(16)->Range(64 << 10, 16 << 20)->UseRealTime();
BENCHMARK_CAPTURE(BM_EngineStream, epoll_x1, std::string("epoll"), 1)
    ->RangeMultiplier(16)->Range(64 << 10, 16 << 20)->UseRealTime();
BENCHMARK_CAPTURE(BM_EngineStream, uring_x1, std::string("uring"), 1)
    ->RangeMultiplier(16)->Range(64 << 10, 16 << 20)->UseRealTime();
BENCHMARK_CAPTURE(BM_EngineStream, epoll_x2, std::string("epoll"), 2)
    ->RangeMultiplier(16)->Range(64 << 10, 16 << 20)->UseRealTime();
BENCHMARK_CAPTURE(BM_EngineStream, uring_x2, std::string("uring"), 2)
    ->RangeMultiplier(16)->Range(64 << 10, 16 << 20)->UseRealTime();
// libfabric (tcp;ofi_rxm here, or FI_PROVIDER): skipped with a reason where not built in.
BENCHMARK_CAPTURE(BM_EngineStream, fabric, std::string("epoll"), 1, std::string("fabric"))
    ->RangeMultiplier(16)->Range(64 << 10, 16 << 20)->UseRealTime();
BENCHMARK_CAPTURE(BM_EnginePingPong, epoll, std::string("tcp"), std::string("epoll"), -1)
    ->Arg(8)->UseRealTime();
BENCHMARK_CAPTURE(BM_EnginePingPong, epoll_spin0, std::string("tcp"), std::string("epoll"), 0)
    ->Arg(8)->UseRealTime();
BENCHMARK_CAPTURE(BM_EnginePingPong, uring, std::string("tcp"), std::string("uring"), -1)
    ->Arg(8)->UseRealTime();
BENCHMARK_CAPTURE(BM_EnginePingPong, uring_spin0, std::string("tcp"), std::string("uring"), 0)
    ->Arg(8)->UseRealTime();
BENCHMARK_CAPTURE(BM_EnginePingPong, fabric, std::string("fabric"), std::string("epoll"), -1)
    ->Arg(8)->UseRealTime();
BENCHMARK_CAPTURE(BM_EnginePingPong, shm, std::string("shm"), std::string("epoll"), -1)
    ->Arg(8)->UseRealTime();
BENCHMARK_CAPTURE(BM_EnginePingPong, shm_spin0, std::string("shm"), std::string("epoll"), 0)
    ->Arg(8)->UseRealTime();

}  // namespace
}  // namespace nanoccl

BENCHMARK_MAIN();
