// TcpTransport's private half: the class behind createTcpTransport() (tcp_transport.h says what
// the transport does and which thread may call what) and its connections with the frames queued
// on them. The transport is a Mover under an Engine (transports/engine.h: requests, commands,
// the progress thread, matching, failure). Included only by tcp_transport.cc (construction,
// listen and connect, the stall reports' socket side) and progress.cc (the Mover: the send and
// receive paths, completions and failure).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "transports/engine.h"
#include "transports/frame.h"
#include "transports/tcp/handshake.h"
#include "transports/tcp/io_engine.h"
#include "transports/tcp/layout.h"
#include "transports/transport.h"

namespace nanoccl::tcp {

constexpr int kMaxSocketsPerPeer = 64;  // stripes are tracked in a 64-bit mask
// stallReport() names a connection whose peer has not acknowledged its bytes for this long.
constexpr uint32_t kStallReportMs = 1000;

// A peer that fails sends its reason on every idle connection, but a connection busy with a
// frame only closes. When a close would fail this transport, it waits this long for a reason
// to arrive on another stream (from that peer or any other) and fails with it if one comes.
constexpr auto kCloseGrace = std::chrono::milliseconds(200);
// How long abort() waits for the progress thread to end the socket operations on callers'
// buffers, before it shuts the sockets down itself (and again after that, before it reports).
constexpr auto kAbortDrain = std::chrono::milliseconds(5000);

using RequestPtr = EngineRequestPtr;
using IncomingPtr = Matcher::IncomingPtr;

struct OutFrame {
  FrameHeader hdr;
  const char* payload;
  RequestPtr req;
};

struct Conn;
struct Cookie {
  Conn* conn;
  bool send;
};

struct Conn {
  int fd = -1;
  int peer = -1;
  int index = 0;
  Cookie recvCookie{this, false};
  Cookie sendCookie{this, true};
  // Receive side: header, then payload (or abort text), then the next header.
  enum class Stage { kHeader, kPayload, kAbortText } stage = Stage::kHeader;
  FrameHeader hdr{};
  IncomingPtr target;  // the message the payload in flight belongs to
  std::string abortText;
  bool recvInFlight = false;
  bool closed = false;  // the peer closed this connection at a frame boundary
  // Send side.
  std::deque<OutFrame> queue;
  bool sendInFlight = false;
};

class TcpTransport : public EngineTransport {
 public:
  explicit TcpTransport(const TransportOptions& o)
      : EngineTransport(o, {.name = "tcp", .closeGrace = kCloseGrace, .drainBound = kAbortDrain}),
        peers_(static_cast<size_t>(o.size)) {}

  ~TcpTransport() override;

  std::vector<RailCounters> railCounters() const override;


  // The interface of `c`'s rail ("" where unknown).
  std::string railName(const Conn& c) const;

  // "connection 1 to rank 0", with " on eth1" where there are several rails: how the stall
  // reports name a connection.
  std::string connectionLabel(const Conn& c) const;

  // Whether interface `ifname` is administratively down or has no carrier (asked through any
  // socket, `fd`); false where it cannot be told.
  static bool interfaceDown(int fd, const std::string& ifname);

  std::string describe() const override;

 private:
  // A peer's connections: nsocks on each rail, connection s on rail s % rails_.
  int connections() const {
    return std::clamp(o_.config.nsocks * rails_, 1, kMaxSocketsPerPeer);
  }

  // ---- setup (engine.h's EngineTransport): tcp_transport.cc --------------------------------
  // The listeners (one a rail) and their addresses with the rails' rates, then the settings
  // every rank must share (address.h).
  Result<std::string> publish() override;
  // The mesh (handshake.cc), the IoEngine and the connections.
  Status attach(const std::vector<std::string>& addresses, const Deadline& deadline) override;
  // Connections are the matcher's lanes; layout() says which carry what.
  MatcherOptions matcherOptions() override;
  Status started(const Deadline& deadline) override;

  // ---- the Mover (engine.h), with the engine's progress held: progress.cc --------------

  void startSend(const RequestPtr& req) override;
  bool progress() override { return pollEngine(0); }
  bool wait(std::chrono::microseconds d) override {
    return pollEngine(static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(d).count()));
  }
  void wake() override { io_->wakeup(); }
  bool sendsPending() const override;
  // Whether a socket operation in flight reads or writes `r`'s buffer (any: socket operations
  // still in flight, each may target a caller's buffer).
  bool busy(const BasicRequest* r) const override;
  // Tells the peers (every idle connection carries the reason), then shuts the sockets down.
  void onFail(const Status& why, bool notifyPeers, RequestList& out) override;
  bool stopped() const override { return inFlight() == 0; }
  // abort() found socket operations on callers' buffers still in flight (the progress thread
  // is stuck, in a callback say): shutting the sockets down from here ends every operation in
  // the kernel all the same; what the peers are told is then only that the connections closed.
  bool unstick() override;
  // The stall report (Transport::stallReport): connections to `peer` that are stuck. From the
  // sockets alone (any thread): bytes the peer has not acknowledged, or queued bytes that have
  // not left, for kStallReportMs, or a rail whose interface is down here; and a connection a
  // message still needs bytes from (partly arrived, or gone past by the peer: the engine's
  // Matcher::awaitedLanes) with how long it has received nothing. A link (a rail) that went
  // down, or a peer whose host stopped, leaves its connections like that; a rank waiting only
  // to receive sees the last two.
  std::string sendStalls(int peer) const override;
  std::optional<LaneView> laneView(int peer, int lane) const override;

  // Handles the IoEngine's completions for up to `timeoutMs`; whether any came.
  bool pollEngine(int timeoutMs);

  // The connections a message travels on (layout.h); `lanes` (the call's
  // OpFingerprint::lanes, 0: all): only the first `lanes` connections of each rail carry the
  // call (the first lanes * rails).
  std::vector<Part> layout(uint64_t seq, uint32_t tag, OpType op, uint64_t total,
                           int lanes) const;

  void kickSend(Conn& c);
  void postHeaderRecv(Conn& c);
  void postRecv(Conn& c, void* dest, uint64_t len);

  void onCompletion(const IoCompletion& ev);
  void onSendDone(Conn& c, int64_t result);
  void onRecvDone(Conn& c, const IoCompletion& ev);
  void onHeader(Conn& c);
  void onPayload(Conn& c, const IncomingPtr& msg);

  Status connectionError(const Conn& c, int64_t result) const;
  // Socket operations still in flight (each may target a caller's buffer).
  size_t inFlight() const;

  std::vector<Listener> listeners_;  // one a rail; closed once connected
  // The congestion control this rank's connections run (chooseCongestionControl; empty: the
  // host's default): set on the listeners, given to the connections this rank makes.
  std::string congestion_;
  int rails_ = 1;
  Rails railLayout_;  // the rails' weights: weighRails() (layout.h)
  // Payload bytes per rail (frames sent, frames landed): written by the progress thread.
  std::unique_ptr<std::atomic<uint64_t>[]> railSent_, railReceived_;
  std::unique_ptr<IoEngine> io_;
  std::vector<std::vector<std::unique_ptr<Conn>>> peers_;
};

}  // namespace nanoccl::tcp
