// The TCP transport (tcp_transport.h says what it does and which thread may call what): the
// class behind createTcpTransport(), its connections and the frames queued on them. The
// transport is a Mover under an Engine (transports/engine.h: requests, commands, the progress
// thread, matching, failure); here are its setup (listen and connect: the mesh itself is built
// by handshake.cc), its send and receive paths (a message's frames striped over the
// connections, layout.h; a header, then its payload or a peer's abort text, matched through the
// engine's Matcher), failure (telling the peers on every idle connection, shutting the sockets
// down), the counters, and the stall reports' socket side. Its sockets are the IoEngine's
// (io_engine.h: io_uring or epoll, and the sealed records where the job encrypts).
#include "transports/tcp/tcp_transport.h"

#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/status.h"
#include "transports/engine.h"
#include "transports/frame.h"
#include "transports/identity.h"
#include "transports/matcher.h"
#include "transports/tcp/address.h"
#include "transports/tcp/handshake.h"
#include "transports/tcp/io_engine.h"
#include "transports/tcp/layout.h"
#include "transports/transport.h"

namespace nanoccl::tcp {
namespace {

constexpr int kMaxSocketsPerPeer = 64;  // stripes are tracked in a 64-bit mask
static_assert(kMaxAbortText <= kRecordBytes, "an abort text is one sealed record (sendNow)");
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

struct Conn {
  int fd = -1;
  int peer = -1;
  int index = 0;
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

  ~TcpTransport() override {
    stopEngine();
    for (auto& row : peers_) {
      for (auto& c : row) {
        if (c->fd >= 0) close(c->fd);
      }
    }
    for (const Listener& l : listeners_) {
      if (l.fd >= 0) close(l.fd);
    }
  }

  std::vector<RailCounters> railCounters() const override {
    std::vector<RailCounters> out;
    if (!railSent_) return out;  // not connected
    for (int k = 0; k < rails_ && k < static_cast<int>(listeners_.size()); ++k) {
      out.push_back({listeners_[k].ifname, railSent_[k].load(std::memory_order_relaxed),
                     railReceived_[k].load(std::memory_order_relaxed)});
    }
    return out;
  }

  std::string describe() const override {
    if (!io_) return "tcp";  // a world of one
    std::string via;
    for (const Listener& l : listeners_) {
      via += via.empty() ? " via " : ",";
      via += l.ifname;
    }
    return std::string("tcp/") + io_->name() + " x" +
           std::to_string(o_.config.nsocks) +
           (rails_ > 1 ? " on each of " + std::to_string(rails_) + " rails" : "") +
           (o_.config.encrypt ? " encrypted" : "") + via;
  }

 private:
  // A peer's connections: nsocks on each rail, connection s on rail s % rails_.
  int connections() const {
    return std::clamp(o_.config.nsocks * rails_, 1, kMaxSocketsPerPeer);
  }

  // ---- setup (engine.h's EngineTransport) ---------------------------------------------------
  // The listeners (one a rail) and their addresses with the rails' rates, then the settings
  // every rank must share (address.h).
  Result<std::string> publish() override {
    for (const Listener& l : listeners_) close(l.fd);  // a listen() refused below, called again
    listeners_.clear();
    NANOCCL_ASSIGN_OR_RETURN(listeners_, openListeners(o_.config.socketIfname));
    // Set on the listeners, the connections they accept inherit it; refused here, before any
    // peer waits on this rank, where the kernel does not allow it.
    for (const Listener& l : listeners_) {
      NANOCCL_ASSIGN_OR_RETURN(congestion_, chooseCongestionControl(l.fd, o_.config.tcpCongestion));
    }
    const std::vector<int64_t>& rates = o_.config.railMbps;
    if (!rates.empty() && rates.size() != listeners_.size()) {
      return invalidArgument("NANOCCL_RAIL_MBPS gives " + std::to_string(rates.size()) +
                             " rate(s) for " + std::to_string(listeners_.size()) +
                             " rail(s) (NANOCCL_SOCKET_IFNAME='" + o_.config.socketIfname +
                             "'): give one a rail, in the same order");
    }
    std::vector<RailAddress> rails;
    for (size_t k = 0; k < listeners_.size(); ++k) {
      rails.push_back({listeners_[k].address,
                       rates.empty() ? interfaceMbps(listeners_[k].ifname) : rates[k]});
    }
    if (o_.config.nsocks * static_cast<int>(rails.size()) > kMaxSocketsPerPeer) {
      return invalidArgument("NANOCCL_NSOCKS=" + std::to_string(o_.config.nsocks) + " on " +
                             std::to_string(rails.size()) + " rail(s) is more than " +
                             std::to_string(kMaxSocketsPerPeer) + " connections a peer");
    }
    // The settings every rank must share: each compares them with everyone's before it connects
    // (buildMesh).
    return formatRails(rails, "size=" + std::to_string(o_.size) +
                                  " nsocks=" + std::to_string(o_.config.nsocks) +
                                  " stripe_min_bytes=" + std::to_string(o_.config.stripeMinBytes) +
                                  " encrypt=" + (o_.config.encrypt ? "1" : "0"));
  }

  // The mesh (handshake.cc), the IoEngine and the connections.
  Status attach(const std::vector<std::string>& addresses, const Deadline& deadline) override {
    if (listeners_.front().fd < 0) {  // a connect() that failed after the mesh was built
      return invalidArgument(engine_.me() + "connect() again after its mesh was built and the "
                             "setup failed: make a new transport");
    }
    NANOCCL_ASSIGN_OR_RETURN(io_, createEngine(o_.config.tcpEngine));
    rails_ = static_cast<int>(listeners_.size());
    railSent_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(rails_));
    railReceived_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(rails_));
    NANOCCL_ASSIGN_OR_RETURN(railLayout_,
                             weighRails(addresses, rails_, o_.config.stripeMinBytes));
    const MeshParams mp{.identity = CommIdentity(o_.secret, o_.commId),
                        .rank = o_.rank,
                        .size = o_.size,
                        .nsocks = connections(),
                        .tcpCongestion = congestion_};
    NANOCCL_ASSIGN_OR_RETURN(auto links, buildMesh(listeners_, addresses, mp, deadline));
    // Setup is over: strangers now meet a closed port.
    for (Listener& l : listeners_) {
      close(l.fd);
      l.fd = -1;
    }
    for (int p = 0; p < o_.size; ++p) {  // the destructor closes them from here on
      for (int s = 0; s < static_cast<int>(links[p].size()); ++s) {
        Conn& c = *peers_[p].emplace_back(std::make_unique<Conn>());
        c.fd = links[p][s].fd;
        c.peer = p;
        c.index = s;
      }
    }
    for (auto& row : peers_) {
      for (auto& c : row) {
        const MeshLink& link = links[c->peer][c->index];
        const IoEngine::Keys keys{link.txKey, link.rxKey};
        NANOCCL_CHECK(io_->addSocket(c->fd, o_.config.encrypt ? &keys : nullptr));
      }
    }
    return Status::ok();
  }

  // Connections are the matcher's lanes; layout() says which carry what.
  MatcherOptions matcherOptions() override {
    MatcherOptions mo;
    mo.lanes = connections();
    mo.parts = [this](OpType op, uint64_t seq, uint32_t tag, uint64_t total, int lanes) {
      return layout(seq, tag, op, total, lanes);
    };
    return mo;
  }

  // The progress thread's first turn: every connection awaits a header.
  Status started(const Deadline&) override {
    engine_.run([this] {
      for (auto& row : peers_) {
        for (auto& c : row) postHeaderRecv(*c);
      }
    });
    return Status::ok();
  }

  // ---- the Mover (engine.h), with the engine's progress held --------------------------------

  void startSend(const RequestPtr& req) override {
    const OpFingerprint& fp = req->env.fingerprint;
    const uint64_t seq = req->wireSeq;
    const auto stripes = layout(seq, req->env.tag, fp.op, req->bytes, fp.lanes);
    for (const Part& s : stripes) {
      if (peers_[req->peer][s.lane]->closed) {
        return engine_.failSoon(connectionError(*peers_[req->peer][s.lane], 0), req);
      }
    }
    req->framesLeft = stripes.size();
    for (const Part& s : stripes) {
      OutFrame f{};
      f.hdr = dataFrameHeader(fp, req->env.tag, seq, req->bytes, s.offset, s.length);
      f.payload = req->buf + s.offset;
      f.req = req;
      Conn& c = *peers_[req->peer][s.lane];
      c.queue.push_back(std::move(f));
      kickSend(c);
    }
  }

  bool progress() override { return pollEngine(0); }
  bool wait(std::chrono::microseconds d) override {
    return pollEngine(static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(d).count()));
  }
  void wake() override { io_->wakeup(); }
  bool sendsPending() const override {
    for (const auto& row : peers_) {
      for (const auto& c : row) {
        if (!c->queue.empty()) return true;
      }
    }
    return false;
  }

  // Whether a socket operation in flight reads or writes `r`'s buffer (any: socket operations
  // still in flight, each may target a caller's buffer).
  bool busy(const BasicRequest* r) const override {
    if (r == nullptr) return inFlight() > 0;
    for (const auto& row : peers_) {
      for (const auto& c : row) {
        if (c->sendInFlight && c->queue.front().req.get() == r) return true;
        if (c->recvInFlight && c->target && c->target->req.get() == r && !c->target->heap) {
          return true;
        }
      }
    }
    return false;
  }

  // Tells the peers (every idle connection carries the reason), then shuts the sockets down.
  void onFail(const Status& why, bool notifyPeers, RequestList& out) override {
    const std::string text = why.message().substr(0, kMaxAbortText);
    const FrameHeader h = abortFrameHeader(text.size());
    const iovec frame[2] = {{const_cast<FrameHeader*>(&h), sizeof(h)},
                            {const_cast<char*>(text.data()), text.size()}};
    for (auto& row : peers_) {
      for (auto& c : row) {
        // The queued sends (the engine completes those whose buffers no socket operation
        // targets; the others complete when it ends: onSendDone).
        for (auto& f : c->queue) {
          if (f.req) out.push_back(f.req);
        }
        // Every idle connection carries the reason before it closes, so a peer reads it
        // whichever connection it hears from first (on a busy one it would land mid-frame).
        if (notifyPeers && !c->sendInFlight) io_->sendNow(c->fd, frame, 2);
      }
    }
    unstick();  // ends every operation in flight on the sockets promptly
  }

  bool stopped() const override { return inFlight() == 0; }
  // abort() found socket operations on callers' buffers still in flight (the progress thread
  // is stuck, in a callback say): shutting the sockets down from here ends every operation in
  // the kernel all the same; what the peers are told is then only that the connections closed.
  bool unstick() override {
    for (auto& row : peers_) {
      for (auto& c : row) shutdown(c->fd, SHUT_RDWR);
    }
    return true;
  }

  // The interface of `c`'s rail ("" where unknown).
  std::string railName(const Conn& c) const {
    const size_t rail = static_cast<size_t>(c.index % rails_);
    return rail < listeners_.size() ? listeners_[rail].ifname : "";
  }

  // "connection 1 to rank 0", with " on eth1" where there are several rails: how the stall
  // reports name a connection.
  std::string connectionLabel(const Conn& c) const {
    return "connection " + std::to_string(c.index) + " to rank " + std::to_string(c.peer) +
           (rails_ > 1 ? " on " + railName(c) : "");
  }

  // Whether interface `ifname` is administratively down or has no carrier (asked through any
  // socket, `fd`); false where it cannot be told.
  static bool interfaceDown(int fd, const std::string& ifname) {
    ifreq ifr{};
    if (ifname.empty() || ifname.size() >= sizeof(ifr.ifr_name)) return false;
    std::memcpy(ifr.ifr_name, ifname.c_str(), ifname.size());
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) != 0) return false;
    return (ifr.ifr_flags & IFF_UP) == 0 || (ifr.ifr_flags & IFF_RUNNING) == 0;
  }

  // The stall report (Transport::stallReport): connections to `peer` that are stuck. From the
  // sockets alone (any thread): bytes the peer has not acknowledged, or queued bytes that have
  // not left, for kStallReportMs, or a rail whose interface is down here; and a connection a
  // message still needs bytes from (partly arrived, or gone past by the peer: the engine's
  // Matcher::awaitedLanes) with how long it has received nothing. A link (a rail) that went
  // down, or a peer whose host stopped, leaves its connections like that; a rank waiting only
  // to receive sees the last two.
  std::string sendStalls(int peer) const override {
    std::string out;
    for (const auto& c : peers_[static_cast<size_t>(peer)]) {
      tcp_info ti{};
      socklen_t len = sizeof(ti);
      int queued = 0;  // sent and not acknowledged, or not sent yet
      if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
          ioctl(c->fd, SIOCOUTQ, &queued) != 0) {
        continue;
      }
      const std::string ifname = railName(*c);
      const bool unacked = ti.tcpi_unacked > 0 && ti.tcpi_last_ack_recv >= kStallReportMs;
      const bool unsent = queued > 0 && ti.tcpi_unacked == 0 &&
                          ti.tcpi_last_data_sent >= kStallReportMs;
      const bool down = interfaceDown(c->fd, ifname);
      if (!unacked && !unsent && !down) continue;
      char line[224];
      int n = std::snprintf(line, sizeof(line), "%s%s:", out.empty() ? "" : "; ",
                            connectionLabel(*c).c_str());
      if (unacked) {
        n += std::snprintf(line + n, sizeof(line) - n, " %.2f MB not acknowledged for %.1f s "
                           "(%u retransmissions)", queued / 1e6, ti.tcpi_last_ack_recv / 1e3,
                           ti.tcpi_total_retrans);
      } else if (unsent) {
        n += std::snprintf(line + n, sizeof(line) - n, " %.2f MB not sent for %.1f s",
                           queued / 1e6, ti.tcpi_last_data_sent / 1e3);
      }
      if (down) {
        std::snprintf(line + n, sizeof(line) - n, "%s%s is down here",
                      unacked || unsent ? ", " : " ", ifname.c_str());
      }
      out += line;
    }
    return out;
  }

  std::optional<LaneView> laneView(int peer, int lane) const override {
    const Conn& c = *peers_[static_cast<size_t>(peer)][static_cast<size_t>(lane)];
    tcp_info ti{};
    socklen_t len = sizeof(ti);
    if (getsockopt(c.fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return std::nullopt;
    char note[64];
    std::snprintf(note, sizeof(note), "nothing received on it for %.1f s",
                  ti.tcpi_last_data_recv / 1e3);
    return LaneView{connectionLabel(c), note};
  }

  // Handles the IoEngine's completions for up to `timeoutMs`; whether any came.
  bool pollEngine(int timeoutMs) {
    bool completed = false;
    const Status st = io_->poll(timeoutMs, [&](const IoCompletion& c) {
      completed = true;
      onCompletion(c);
    });
    if (!st.isOk()) engine_.fail(st.withContext(engine_.me()), true);
    return completed;
  }

  // The connections a message travels on (layout.h); `lanes` (the call's
  // OpFingerprint::lanes, 0: all): only the first `lanes` connections of each rail carry the
  // call (the first lanes * rails).
  std::vector<Part> layout(uint64_t seq, uint32_t tag, OpType op, uint64_t total,
                           int lanes) const {
    int n = connections();
    if (lanes > 0) n = std::min(n, lanes * rails_);
    return layoutMessage(railLayout_, n, op, seq, tag, total);
  }

  void kickSend(Conn& c) {
    if (c.sendInFlight || c.queue.empty() || !engine_.failed().isOk()) return;
    OutFrame& f = c.queue.front();
    const iovec iov[2] = {{&f.hdr, sizeof(f.hdr)},
                          {const_cast<char*>(f.payload), static_cast<size_t>(f.hdr.length)}};
    c.sendInFlight = true;
    if (Status st = io_->postSend(c.fd, iov, 2, &c); !st.isOk()) {
      c.sendInFlight = false;
      engine_.fail(st, true);
    }
  }

  void postHeaderRecv(Conn& c) {
    if (!engine_.failed().isOk()) return;
    c.stage = Conn::Stage::kHeader;
    c.target.reset();
    postRecv(c, &c.hdr, sizeof(c.hdr));
  }

  void postRecv(Conn& c, void* dest, uint64_t len) {
    c.recvInFlight = true;
    if (Status st = io_->postRecv(c.fd, dest, len, &c); !st.isOk()) {
      c.recvInFlight = false;
      engine_.fail(st, true);
    }
  }

  void onCompletion(const IoCompletion& ev) {
    Conn& c = *static_cast<Conn*>(ev.cookie);
    if (ev.send) {
      onSendDone(c, ev);
    } else {
      onRecvDone(c, ev);
    }
    engine_.updateDrained();
  }

  void onSendDone(Conn& c, const IoCompletion& ev) {
    const int64_t result = ev.result;
    c.sendInFlight = false;
    OutFrame f = std::move(c.queue.front());
    c.queue.pop_front();
    if (!engine_.failed().isOk()) return engine_.completeIfFree(f.req);
    if (!ev.error.isOk()) engine_.fail(ev.error.withContext(engine_.me()), true);  // this side's
    if (result < 0) return engine_.failSoon(connectionError(c, result), f.req);
    if (f.req) railSent_[c.index % rails_].fetch_add(f.hdr.length, std::memory_order_relaxed);
    if (f.req) engine_.frameSent(f.req);
    kickSend(c);
  }

  void onRecvDone(Conn& c, const IoCompletion& ev) {
    const int64_t result = ev.result;
    c.recvInFlight = false;
    IncomingPtr target = std::move(c.target);
    if (!engine_.failed().isOk()) {
      // The buffer is released now: complete the receive it belonged to.
      if (target) engine_.completeIfFree(target->req);
      return;
    }
    if (result == 0 && c.stage == Conn::Stage::kHeader) {  // closed in order, at a frame's end
      c.closed = true;
      engine_.laneClosed(c.peer, c.index);
      return;
    }
    if (result == -EBADMSG) {  // a sealed record that did not open
      return engine_.failFrom(c.peer, protocolError("connection " + std::to_string(c.index) + ": " +
                                                    ev.error.message() +
                                                    "; the receive fails rather than deliver it"));
    }
    // Cut mid-frame (a peer killed while sending, say): the receive the frame was for is held
    // by no table once `target` is dropped (a point-to-point message never is), so it is
    // parked to complete with the failure.
    if (result <= 0) {
      return engine_.failSoon(connectionError(c, result), target ? target->req : nullptr);
    }
    switch (c.stage) {
      case Conn::Stage::kHeader: return onHeader(c);
      case Conn::Stage::kPayload: return onPayload(c, target);
      case Conn::Stage::kAbortText: return engine_.peerFailed(c.peer, c.abortText);
    }
  }

  void onHeader(Conn& c) {
    const FrameHeader& h = c.hdr;
    if (Status st = validateFrameHeader(h); !st.isOk()) return engine_.failFrom(c.peer, st);
    if (h.kind == FrameKind::kAbort) {
      c.stage = Conn::Stage::kAbortText;
      c.abortText.assign(h.length, '\0');
      if (h.length == 0) return engine_.peerFailed(c.peer, c.abortText);
      return postRecv(c, c.abortText.data(), h.length);
    }
    Result<IncomingPtr> msg = engine_.matcher().onFrame(c.peer, c.index, h);
    if (!msg.isOk()) return engine_.fail(msg.status(), true);
    if (h.length == 0) {
      engine_.matcher().landed(msg.value(), 0);
      return postHeaderRecv(c);
    }
    c.stage = Conn::Stage::kPayload;
    c.target = msg.value();
    postRecv(c, c.target->dest(h.offset), h.length);
  }

  void onPayload(Conn& c, const IncomingPtr& msg) {
    railReceived_[c.index % rails_].fetch_add(c.hdr.length, std::memory_order_relaxed);
    engine_.matcher().landed(msg, c.hdr.length);
    postHeaderRecv(c);
  }

  Status connectionError(const Conn& c, int64_t result) const {
    const std::string who = engine_.me() + "connection to rank " + std::to_string(c.peer);
    if (result == 0) {
      return peerError(who + " closed (rank " + std::to_string(c.peer) +
                       " exited, crashed or destroyed its communicator)");
    }
    return peerError(who + " failed: " + std::strerror(static_cast<int>(-result)));
  }

  // Socket operations still in flight (each may target a caller's buffer).
  size_t inFlight() const {
    size_t n = 0;
    for (const auto& row : peers_) {
      for (const auto& c : row) n += (c->recvInFlight ? 1 : 0) + (c->sendInFlight ? 1 : 0);
    }
    return n;
  }

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

}  // namespace

Result<std::unique_ptr<Transport>> createTcpTransport(const TransportOptions& options) {
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(options));
}

}  // namespace nanoccl::tcp
