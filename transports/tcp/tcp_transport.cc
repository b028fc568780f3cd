#include "transports/tcp/tcp_transport.h"

#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <vector>

#include "common/crypto.h"
#include "common/logging.h"
#include "common/secret.h"
#include "common/spin.h"
#include "common/thread_name.h"
#include "transports/matcher.h"
#include "transports/transport_common.h"
#include "transports/request.h"
#include "transports/tcp/handshake.h"
#include "transports/tcp/layout.h"
#include "transports/tcp/socket_ops.h"
#include "transports/tcp/wire.h"

namespace nanoccl::tcp {
namespace {

constexpr int kMaxSocketsPerPeer = 64;  // stripes are tracked in a 64-bit mask
// stallReport() names a connection whose peer has not acknowledged its bytes for this long.
constexpr uint32_t kStallReportMs = 1000;
// How long stallReport() waits for the progress thread's part (receiveStalls()).
constexpr auto kReportWait = std::chrono::milliseconds(500);

// Encryption (NANOCCL_ENCRYPT=1): every frame travels as sealed records, its header as one
// record of sizeof(FrameHeader) bytes and its payload as records of at most kRecordBytes, each
// followed by its GCM tag; each direction of each connection has its own key (from the
// handshake) and record counter (crypto::Aead). A send seals up to kRecordsPerSend records into
// the connection's staging buffer while the previous ones drain from the socket buffer; a
// receive takes one record into staging and opens it into the message's buffer.
constexpr uint64_t kRecordBytes = 256 * 1024;
constexpr uint64_t kRecordsPerSend = 2;
constexpr uint64_t kSealedHeaderBytes = sizeof(FrameHeader) + crypto::kTagBytes;
static_assert(kMaxAbortText <= kRecordBytes, "an abort text is one record");

// A peer that fails sends its reason on every idle connection, but a connection busy with a
// frame only closes. When a close would fail this transport, it waits this long for a reason
// to arrive on another stream (from that peer or any other) and fails with it if one comes.
constexpr auto kCloseGrace = std::chrono::milliseconds(200);
// How long abort() waits for the progress thread to end the socket operations on callers'
// buffers, before it shuts the sockets down itself (and again after that, before it reports).
constexpr auto kAbortDrain = std::chrono::milliseconds(5000);

class TcpRequest : public BasicRequest {
 public:
  using BasicRequest::BasicRequest;
  size_t framesLeft = 0;  // send: frames not yet written (progress thread)
};
using RequestPtr = std::shared_ptr<TcpRequest>;
using IncomingPtr = Matcher::IncomingPtr;

struct OutFrame {
  FrameHeader hdr;
  const char* payload;
  RequestPtr req;
  // Encrypted connections: how much of the frame is sealed (and posted) so far.
  bool headerSealed = false;
  uint64_t payloadSealed = 0;
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
  // Encryption: set when the job encrypts (see kRecordBytes).
  std::optional<crypto::Aead> tx;
  std::optional<crypto::Aead> rx;
  std::vector<char> txStage;
  std::vector<char> rxStage;
  char* rxDest = nullptr;    // where the record being received opens to
  uint64_t rxRecord = 0;     // its payload bytes
  uint64_t rxLeft = 0;       // payload bytes of the frame still to come after it
};

enum class CommandKind { kSend, kRecv, kAbort, kStop, kReport };
struct Command {
  CommandKind kind;
  RequestPtr req;
  Status why;
  // kReport: the receive side's stall report on `peer` (receiveStalls()), set by the progress
  // thread, which owns the matcher.
  int peer = -1;
  std::shared_ptr<std::promise<std::string>> report;
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(const TransportOptions& o)
      : o_(o),
        peers_(static_cast<size_t>(o.size)),
        counters_(o.size) {}

  ~TcpTransport() override {
    if (thread_.joinable()) {
      post({CommandKind::kStop, nullptr, abortedError("rank " + std::to_string(o_.rank) +
                                                      ": communicator destroyed")});
      thread_.join();
    }
    for (auto& row : peers_) {
      for (auto& c : row) {
        if (c->fd >= 0) close(c->fd);
      }
    }
    for (const Listener& l : listeners_) {
      if (l.fd >= 0) close(l.fd);
    }
  }

  Result<std::string> listen() override {
    if (o_.size == 1) return std::string();
    if (o_.config.nsocks > kMaxSocketsPerPeer) {
      return invalidArgument("NANOCCL_NSOCKS=" + std::to_string(o_.config.nsocks) +
                             " exceeds the limit of " + std::to_string(kMaxSocketsPerPeer));
    }
    NANOCCL_ASSIGN_OR_RETURN(listeners_, openListeners(o_.config.socketIfname));
    if (!o_.config.tcpCongestion.empty()) {
      // Set on the listeners, the connections they accept inherit it; refused here, before
      // any peer waits on this rank, where the kernel does not allow it.
      for (const Listener& l : listeners_) {
        NANOCCL_CHECK(setCongestionControl(l.fd, o_.config.tcpCongestion));
      }
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
                             std::to_string(rails.size()) + " rails is more than " +
                             std::to_string(kMaxSocketsPerPeer) + " connections a peer");
    }
    return formatRails(rails);
  }

  Status connect(const std::vector<std::string>& addresses, const Deadline& deadline) override {
    NANOCCL_ASSIGN_OR_RETURN(engine_, createEngine(o_.config.tcpEngine));
    rails_ = std::max<int>(1, static_cast<int>(listeners_.size()));
    railSent_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(rails_));
    railReceived_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(rails_));
    NANOCCL_ASSIGN_OR_RETURN(railLayout_,
                             weighRails(addresses, rails_, o_.config.stripeMinBytes));
    matcher_.emplace(matcherOptions());
    if (o_.size > 1) {
      MeshParams mp{CommIdentity(o_.secret, o_.commId)};
      mp.rank = o_.rank;
      mp.size = o_.size;
      mp.nsocks = connections();
      mp.stripeMinBytes = o_.config.stripeMinBytes;
      mp.encrypt = o_.config.encrypt;
      mp.tcpCongestion = o_.config.tcpCongestion;
      NANOCCL_ASSIGN_OR_RETURN(auto links, buildMesh(listeners_, addresses, mp, deadline));
      // Setup is over: strangers now meet a closed port.
      for (Listener& l : listeners_) {
        close(l.fd);
        l.fd = -1;
      }
      for (int p = 0; p < o_.size; ++p) {
        for (int s = 0; s < static_cast<int>(links[p].size()); ++s) {
          auto c = std::make_unique<Conn>();
          c->fd = links[p][s].fd;
          c->peer = p;
          c->index = s;
          peers_[p].push_back(std::move(c));
          if (o_.config.encrypt) {
            Conn& conn = *peers_[p].back();
            NANOCCL_ASSIGN_OR_RETURN(conn.tx, crypto::Aead::create(links[p][s].txKey));
            NANOCCL_ASSIGN_OR_RETURN(conn.rx, crypto::Aead::create(links[p][s].rxKey));
            conn.txStage.resize(kSealedHeaderBytes +
                                kRecordsPerSend * (kRecordBytes + crypto::kTagBytes));
            conn.rxStage.resize(kRecordBytes + crypto::kTagBytes);
          }
        }
      }
      for (auto& row : peers_) {
        for (auto& c : row) NANOCCL_CHECK(engine_->addSocket(c->fd));
      }
    }
    NANOCCL_INFO("rank " << o_.rank << ": " << describe() << " connected to " << o_.size - 1
                         << " peers");
    thread_ = namedThread("tcp", [this] { progressLoop(); });
    return Status::ok();
  }

  std::shared_ptr<Request> isend(int peer, const Envelope& env, const void* buf,
                                 size_t bytes) override {
    auto req = std::make_shared<TcpRequest>(
        true, peer, env, const_cast<char*>(static_cast<const char*>(buf)), bytes, spin_);
    return startRequest(std::move(req), o_.rank, o_.size, thread_.joinable(),
                        [&](const auto& r) { post({CommandKind::kSend, r, {}}); });
  }

  std::shared_ptr<Request> irecv(int peer, const Envelope& env, void* buf,
                                 size_t bytes) override {
    auto req =
        std::make_shared<TcpRequest>(false, peer, env, static_cast<char*>(buf), bytes, spin_);
    return startRequest(std::move(req), o_.rank, o_.size, thread_.joinable(),
                        [&](const auto& r) { post({CommandKind::kRecv, r, {}}); });
  }

  void abort(const Status& why) override {
    if (!thread_.joinable()) return;
    if (std::this_thread::get_id() == thread_.get_id()) {  // from a completion callback
      fail(why, true);
      return;
    }
    post({CommandKind::kAbort, nullptr, why});
    // fail() tells the peers, then shuts the sockets down: in-flight operations end within
    // moments and the progress thread reaps them.
    if (drained_.waitFor(kAbortDrain)) return;
    // The progress thread has not got there (it is stuck, in a callback say). Shutting the
    // sockets down from here ends every operation in the kernel all the same; what the peers
    // are told is then only that the connections closed.
    NANOCCL_WARN("rank " << o_.rank << ": tcp: abort found socket operations on callers' "
                 "buffers still in flight after " << kAbortDrain.count() << " ms; shutting "
                 "the sockets down from this thread");
    for (auto& row : peers_) {
      for (auto& c : row) shutdown(c->fd, SHUT_RDWR);
    }
    if (!drained_.waitFor(kAbortDrain)) {
      NANOCCL_WARN("rank " << o_.rank << ": tcp: the progress thread has still not reaped "
                   "them; the requests on those buffers stay pending until it does, and "
                   "destroying the transport waits for it");
    }
  }

  std::vector<PeerCounters> counters() const override { return counters_.snapshot(); }

  std::vector<RailCounters> railCounters() const override {
    std::vector<RailCounters> out;
    if (!railSent_) return out;  // not connected
    for (int k = 0; k < rails_ && k < static_cast<int>(listeners_.size()); ++k) {
      out.push_back({listeners_[k].ifname, railSent_[k].load(std::memory_order_relaxed),
                     railReceived_[k].load(std::memory_order_relaxed)});
    }
    return out;
  }

  // Connections to `peer` that are stuck: bytes the peer has not acknowledged for a while, bytes
  // queued that have not left for a while, a rail whose interface is down here, or a message
  // whose part on a connection is missing (partly arrived, or one the peer has gone past:
  // Matcher::awaitedLanes). A link (a rail) that went down, or a peer whose host stopped, leaves
  // its connections like that; a rank waiting only to receive sees the last two.
  std::string stallReport(int peer) const override {
    if (peer < 0 || peer >= o_.size || peer == o_.rank || !thread_.joinable()) return "";
    std::string out = socketStalls(peer);
    // What this rank waits for: asked of the progress thread, which owns the matcher (briefly:
    // a transport that is stopping may not answer).
    auto report = std::make_shared<std::promise<std::string>>();
    std::future<std::string> answer = report->get_future();
    Command ask{CommandKind::kReport, nullptr, Status::ok()};
    ask.peer = peer;
    ask.report = report;
    const_cast<TcpTransport*>(this)->post(std::move(ask));  // only queues a command
    if (answer.wait_for(kReportWait) == std::future_status::ready) {
      try {
        const std::string waited = answer.get();
        if (!waited.empty()) out += (out.empty() ? "" : "; ") + waited;
      } catch (const std::future_error&) {  // dropped unanswered: nothing to add
      }
    }
    return out.empty() ? out : out + " (is a link down?)";
  }

  // The sending side of stallReport(), from the sockets alone (any thread): connections to
  // `peer` with bytes unacknowledged or unsent for kStallReportMs, or whose interface is down.
  std::string socketStalls(int peer) const {
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

  // Progress thread: the connections to `peer` from which a message still needs bytes (partly
  // arrived, or gone past by the peer: Matcher::awaitedLanes), and how long each has received
  // nothing.
  std::string receiveStalls(int peer) const {
    std::map<int, std::pair<uint64_t, int>> byLane;  // lane -> bytes, messages
    for (const Matcher::AwaitedLane& a : matcher_->awaitedLanes(peer)) {
      byLane[a.lane].first += a.bytes;
      ++byLane[a.lane].second;
    }
    std::string out;
    for (const auto& [lane, waited] : byLane) {
      const Conn& c = *peers_[static_cast<size_t>(peer)][static_cast<size_t>(lane)];
      tcp_info ti{};
      socklen_t len = sizeof(ti);
      if (getsockopt(c.fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) continue;
      char line[200];
      std::snprintf(line, sizeof(line), "%s%s: %.2f MB still to arrive (%d message%s), nothing "
                    "received on it for %.1f s", out.empty() ? "" : "; ",
                    connectionLabel(c).c_str(), waited.first / 1e6, waited.second,
                    waited.second == 1 ? "" : "s", ti.tcpi_last_data_recv / 1e3);
      out += line;
    }
    return out;
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

  std::string describe() const override {
    std::string via;
    for (const Listener& l : listeners_) {
      via += via.empty() ? " via " : ",";
      via += l.ifname;
    }
    return std::string("tcp/") + (engine_ ? engine_->name() : "?") + " x" +
           std::to_string(o_.config.nsocks) +
           (rails_ > 1 ? " on each of " + std::to_string(rails_) + " rails" : "") +
           (o_.config.encrypt ? " encrypted" : "") + via;
  }

 private:
  // A peer's connections: nsocks on each rail, connection s on rail s % rails_.
  int connections() const {
    return std::clamp(o_.config.nsocks * rails_, 1, kMaxSocketsPerPeer);
  }

  // Connections are the matcher's lanes; layout() says which carry what.
  MatcherOptions matcherOptions() {
    MatcherOptions mo = matcherOptionsFor(o_, &counters_);
    mo.lanes = connections();
    mo.parts = [this](OpType op, uint64_t seq, uint32_t tag, uint64_t total, int lanes) {
      return layout(seq, tag, op, total, lanes);
    };
    return mo;
  }

  void post(Command cmd) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands_.push_back(std::move(cmd));
      commandsWaiting_.store(true, std::memory_order_release);
    }
    engine_->wakeup();
  }

  // ---- progress thread ----------------------------------------------------------------

  void progressLoop() {
    for (auto& row : peers_) {
      for (auto& c : row) postHeaderRecv(*c);
    }
    bool stopping = false;
    Clock::time_point lastBusy{};  // the last command or completion
    while (true) {
      std::deque<Command> cmds;
      {
        std::lock_guard<std::mutex> lock(mu_);
        cmds.swap(commands_);
        commandsWaiting_.store(false, std::memory_order_relaxed);
      }
      for (auto& cmd : cmds) {
        switch (cmd.kind) {
          case CommandKind::kSend: startSend(cmd.req); break;
          case CommandKind::kRecv: startRecv(cmd.req); break;
          case CommandKind::kAbort: fail(cmd.why, true); break;
          case CommandKind::kReport: cmd.report->set_value(receiveStalls(cmd.peer)); break;
          case CommandKind::kStop:
            stopping = true;
            // Peers hear about it only if this rank still had work pending.
            fail(cmd.why, hasPending());
            break;
        }
      }
      updateDrained();
      if (stopping && inFlight() == 0) return;
      int timeoutMs = 1000;
      if (closing_) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(closing_->until -
                                                                       Clock::now());
        timeoutMs = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
      }
      bool completed = false;
      const auto onDone = [&](const IoCompletion& c) {
        completed = true;
        onCompletion(c);
      };
      Status st;
      const Clock::time_point waitStart = Clock::now();
      if (!cmds.empty()) lastBusy = waitStart;
      // A call in flight: its next completion may come soon, if its recent ones did
      // (SpinPolicy). One just ended: the next of back-to-back calls may be due. Either way,
      // poll without sleeping for a while first (common/spin.h).
      const bool inFlight = hasPending();
      const std::chrono::microseconds spin =
          inFlight ? SpinPolicy::budget(spin_) : waitStart < lastBusy + spin_ ? spin_ : kNoSpin;
      if (spin.count() > 0 && !closing_ && failed_.isOk()) {
        spinFor(spin, [&] {
          st = engine_->poll(0, onDone);
          return completed || !st.isOk() || commandsWaiting_.load(std::memory_order_acquire);
        });
      }
      if (!completed && st.isOk() && !commandsWaiting_.load(std::memory_order_acquire)) {
        st = engine_->poll(timeoutMs, onDone);
      }
      if (inFlight) SpinPolicy::record(spin_, Clock::now() - waitStart);
      if (completed) lastBusy = Clock::now();
      if (!st.isOk()) fail(st.withContext("rank " + std::to_string(o_.rank) + ": "), true);
      if (closing_ && Clock::now() >= closing_->until) {
        const Status why = std::move(closing_->why);  // fail() resets closing_
        fail(why, true);
      }
    }
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

  void startSend(const RequestPtr& req) {
    if (!failed_.isOk()) return req->complete(failed_, -1);
    const OpFingerprint& fp = req->env.fingerprint;
    const uint64_t seq = matcher_->wireSeq(*req);
    const auto stripes = layout(seq, req->env.tag, fp.op, req->bytes, fp.lanes);
    for (const Part& s : stripes) {
      if (peers_[req->peer][s.lane]->closed) {
        return failOnClose(connectionError(*peers_[req->peer][s.lane], 0), req);
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

  void kickSend(Conn& c) {
    if (c.sendInFlight || c.queue.empty() || !failed_.isOk()) return;
    OutFrame& f = c.queue.front();
    iovec iov[2] = {{&f.hdr, sizeof(f.hdr)},
                    {const_cast<char*>(f.payload), static_cast<size_t>(f.hdr.length)}};
    int iovcnt = 2;
    if (c.tx) {
      Result<size_t> sealed = sealNext(c, f);
      if (!sealed.isOk()) return fail(sealed.status(), true);
      iov[0] = {c.txStage.data(), sealed.value()};
      iovcnt = 1;
    }
    c.sendInFlight = true;
    if (Status st = engine_->postSend(c.fd, iov, iovcnt, &c.sendCookie); !st.isOk()) {
      c.sendInFlight = false;
      fail(st, true);
    }
  }

  // Seals the frame's next records (its header first) into c.txStage; returns their bytes.
  Result<size_t> sealNext(Conn& c, OutFrame& f) {
    char* out = c.txStage.data();
    size_t len = 0;
    if (!f.headerSealed) {
      NANOCCL_CHECK(c.tx->seal(&f.hdr, sizeof(f.hdr), out));
      len += kSealedHeaderBytes;
      f.headerSealed = true;
    }
    for (uint64_t i = 0; i < kRecordsPerSend && f.payloadSealed < f.hdr.length; ++i) {
      const uint64_t n = std::min(kRecordBytes, f.hdr.length - f.payloadSealed);
      NANOCCL_CHECK(c.tx->seal(f.payload + f.payloadSealed, n, out + len));
      len += n + crypto::kTagBytes;
      f.payloadSealed += n;
    }
    return len;
  }

  void startRecv(const RequestPtr& req) {
    if (!failed_.isOk()) return req->complete(failed_, -1);
    const Status st = matcher_->postRecv(req);
    if (st.isOk()) return;
    // A connection it needs is closed: the peer's reason may still come on another.
    if (st.code() == StatusCode::kPeerError) return failOnClose(st, req);
    fail(st, true);
    req->complete(failed_, -1);  // held by no table: fail() cannot see it
  }

  void postHeaderRecv(Conn& c) {
    if (!failed_.isOk()) return;
    c.stage = Conn::Stage::kHeader;
    c.target.reset();
    if (c.rx) return postRecv(c, c.rxStage.data(), kSealedHeaderBytes);
    postRecv(c, &c.hdr, sizeof(c.hdr));
  }

  void postPayloadRecv(Conn& c, char* dest, uint64_t len) {
    if (!c.rx) return postRecv(c, dest, len);
    c.rxDest = dest;
    c.rxLeft = len;
    postNextRecord(c);
  }

  void postNextRecord(Conn& c) {
    c.rxRecord = std::min(kRecordBytes, c.rxLeft);
    c.rxLeft -= c.rxRecord;
    postRecv(c, c.rxStage.data(), c.rxRecord + crypto::kTagBytes);
  }

  void postRecv(Conn& c, void* dest, uint64_t len) {
    c.recvInFlight = true;
    if (Status st = engine_->postRecv(c.fd, dest, len, &c.recvCookie); !st.isOk()) {
      c.recvInFlight = false;
      fail(st, true);
    }
  }

  // Opens the record that just arrived on an encrypted connection: the frame header, or the
  // next piece of a payload. A record that fails its tag fails the transport.
  Status openRecord(Conn& c) {
    Status st = c.stage == Conn::Stage::kHeader
                    ? c.rx->open(c.rxStage.data(), sizeof(c.hdr), &c.hdr)
                    : c.rx->open(c.rxStage.data(), c.rxRecord, c.rxDest);
    if (!st.isOk()) {
      return protocolError("rank " + std::to_string(o_.rank) + ": from rank " +
                           std::to_string(c.peer) + " (connection " + std::to_string(c.index) +
                           "): " + st.message() + "; the receive fails rather than deliver it");
    }
    if (c.stage != Conn::Stage::kHeader) c.rxDest += c.rxRecord;
    return Status::ok();
  }

  void onCompletion(const IoCompletion& ev) {
    const Cookie& cookie = *static_cast<Cookie*>(ev.cookie);
    Conn& c = *cookie.conn;
    if (cookie.send) {
      onSendDone(c, ev.result);
    } else {
      onRecvDone(c, ev.result);
    }
    updateDrained();
  }

  void onSendDone(Conn& c, int64_t result) {
    c.sendInFlight = false;
    if (c.tx && result > 0 && failed_.isOk() &&
        c.queue.front().payloadSealed < c.queue.front().hdr.length) {
      return kickSend(c);  // the frame's next records
    }
    OutFrame f = std::move(c.queue.front());
    c.queue.pop_front();
    if (!failed_.isOk()) {
      if (f.req && !busy(*f.req)) f.req->complete(failed_, -1);
      return;
    }
    if (result < 0) return failOnClose(connectionError(c, result), f.req);
    if (f.req) railSent_[c.index % rails_].fetch_add(f.hdr.length, std::memory_order_relaxed);
    if (f.req && --f.req->framesLeft == 0) {
      counters_.sent(c.peer, f.req->bytes);
      f.req->complete(Status::ok(), o_.rank);
    }
    kickSend(c);
  }

  void onRecvDone(Conn& c, int64_t result) {
    c.recvInFlight = false;
    IncomingPtr target = std::move(c.target);
    if (!failed_.isOk()) {
      // The buffer is released now: complete the receive it belonged to.
      if (target && target->req && !busy(*target->req)) target->req->complete(failed_, -1);
      return;
    }
    if (result == 0 && c.stage == Conn::Stage::kHeader) return onOrderlyClose(c);
    // Cut mid-frame (a peer killed while sending, say): the receive the frame was for is held
    // by no table once `target` is dropped (a point-to-point message never is), so it is
    // parked to complete with the failure.
    if (result <= 0) {
      return failOnClose(connectionError(c, result), target ? target->req : nullptr);
    }
    if (c.rx) {
      if (Status st = openRecord(c); !st.isOk()) return fail(st, true);
      if (c.stage != Conn::Stage::kHeader && c.rxLeft > 0) {
        c.target = std::move(target);
        return postNextRecord(c);
      }
    }
    switch (c.stage) {
      case Conn::Stage::kHeader: return onHeader(c);
      case Conn::Stage::kPayload: return onPayload(c, target);
      case Conn::Stage::kAbortText: return onAbortText(c);
    }
  }

  // The peer failed and says why. What this rank sees stuck on its way to that peer goes with
  // it: where the peer timed out waiting for bytes that left here, the link they are stuck on
  // (a rail down here, say) is told only on this side.
  void onAbortText(const Conn& c) {
    const std::string stuck = socketStalls(c.peer);
    const std::string hint = " (is a link down?)";
    fail(peerError("rank " + std::to_string(o_.rank) + ": rank " + std::to_string(c.peer) +
                   " failed: " + c.abortText +
                   (stuck.empty() ? ""
                                  : "; on rank " + std::to_string(o_.rank) + ": " + stuck +
                                        (c.abortText.find(hint) == std::string::npos ? hint
                                                                                     : ""))),
         true);
  }

  void onHeader(Conn& c) {
    const FrameHeader& h = c.hdr;
    if (Status st = validateFrameHeader(h); !st.isOk()) {
      return fail(st.withContext("rank " + std::to_string(o_.rank) + ": from rank " +
                                 std::to_string(c.peer) + ": "),
                  true);
    }
    if (h.kind == FrameKind::kAbort) {
      c.stage = Conn::Stage::kAbortText;
      c.abortText.assign(h.length, '\0');
      if (h.length == 0) return onAbortText(c);
      return postPayloadRecv(c, c.abortText.data(), h.length);
    }
    Result<IncomingPtr> msg = matcher_->onFrame(c.peer, c.index, h);
    if (!msg.isOk()) return fail(msg.status(), true);
    if (h.length == 0) {
      matcher_->landed(msg.value(), 0);
      return postHeaderRecv(c);
    }
    c.stage = Conn::Stage::kPayload;
    c.target = msg.value();
    postPayloadRecv(c, c.target->dest(h.offset), h.length);
  }

  void onPayload(Conn& c, const IncomingPtr& msg) {
    railReceived_[c.index % rails_].fetch_add(c.hdr.length, std::memory_order_relaxed);
    matcher_->landed(msg, c.hdr.length);
    postHeaderRecv(c);
  }

  // The peer closed `c` cleanly: what already arrived stays receivable; only receives that
  // needed more from this connection fail.
  void onOrderlyClose(Conn& c) {
    c.closed = true;
    NANOCCL_INFO("rank " << o_.rank << ": rank " << c.peer << " closed connection " << c.index);
    counters_.closed(c.peer);
    if (auto req = matcher_->laneClosed(c.peer, c.index)) {
      failOnClose(matcher_->closedError(c.peer, *req));
    }
  }

  Status connectionError(const Conn& c, int64_t result) const {
    const std::string who = "rank " + std::to_string(o_.rank) + ": connection to rank " +
                            std::to_string(c.peer);
    if (result == 0) {
      return peerError(who + " closed (rank " + std::to_string(c.peer) +
                       " exited, crashed or destroyed its communicator)");
    }
    return peerError(who + " failed: " + std::strerror(static_cast<int>(-result)));
  }

  bool hasPending() const {
    if (matcher_->hasPending()) return true;
    for (const auto& row : peers_) {
      for (const auto& c : row) {
        if (!c->queue.empty()) return true;
      }
    }
    return false;
  }

  // Socket operations still in flight (each may target a caller's buffer).
  size_t inFlight() const {
    size_t n = 0;
    for (const auto& row : peers_) {
      for (const auto& c : row) n += (c->recvInFlight ? 1 : 0) + (c->sendInFlight ? 1 : 0);
    }
    return n;
  }

  void updateDrained() {
    if (failed_.isOk() || inFlight() > 0) return;
    drained_.set();
  }

  // Fails the transport: every request completes with `why` (those whose buffers a socket
  // operation still targets as soon as that operation ends), and peers are told.
  // A connection closed under a pending request: fail after kCloseGrace with `why`, unless a
  // peer's reason (an abort frame) or another failure comes first. `parked` (a request that
  // cannot proceed, held by no table) completes when the transport fails.
  void failOnClose(const Status& why, const std::shared_ptr<BasicRequest>& parked = nullptr) {
    if (!failed_.isOk()) {
      if (parked && !busy(*parked)) parked->complete(failed_, -1);
      return;
    }
    if (parked) parked_.push_back(parked);
    if (!closing_) closing_ = Closing{why, Clock::now() + kCloseGrace};
  }

  void fail(const Status& why, bool notifyPeers) {
    if (!failed_.isOk()) return;
    failed_ = why;
    closing_.reset();
    {
      std::lock_guard<std::mutex> lock(mu_);
      failedPublic_ = why;
    }
    logTransportFailure(o_.rank, why, hasPending());
    const std::string text = why.message().substr(0, kMaxAbortText);
    for (auto& row : peers_) {
      if (notifyPeers) {
        // Every idle connection to this peer carries the reason before it closes, so the peer
        // reads it whichever connection it hears from first.
        for (auto& c : row) {
          if (c->sendInFlight) continue;
          FrameHeader h = abortFrameHeader(text.size());
          iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(text.data()), text.size()}};
          size_t iovlen = 2;
          std::string sealed;  // header and text records, on an encrypted connection
          if (c->tx) {
            sealed.resize(kSealedHeaderBytes + text.size() + crypto::kTagBytes);
            if (!c->tx->seal(&h, sizeof(h), sealed.data()).isOk() ||
                (!text.empty() &&
                 !c->tx->seal(text.data(), text.size(), sealed.data() + kSealedHeaderBytes)
                      .isOk())) {
              continue;
            }
            if (text.empty()) sealed.resize(kSealedHeaderBytes);
            iov[0] = {sealed.data(), sealed.size()};
            iovlen = 1;
          }
          msghdr m{};
          m.msg_iov = iov;
          m.msg_iovlen = iovlen;
          [[maybe_unused]] ssize_t n = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
      }
      // Ends every in-flight operation on these sockets promptly.
      for (auto& c : row) shutdown(c->fd, SHUT_RDWR);
    }
    // Requests whose buffers a socket operation still targets complete when it ends.
    for (auto& row : peers_) {
      for (auto& c : row) {
        for (auto& f : c->queue) {
          if (f.req && !busy(*f.req)) f.req->complete(why, -1);
        }
      }
    }
    for (auto& r : matcher_->takeAll()) {
      if (!busy(*r)) r->complete(why, -1);
    }
    for (auto& r : parked_) {
      if (!busy(*r)) r->complete(why, -1);
    }
    parked_.clear();
    updateDrained();
  }

  // Whether a socket operation in flight reads or writes `r`'s buffer.
  bool busy(const BasicRequest& r) const {
    for (const auto& row : peers_) {
      for (const auto& c : row) {
        if (c->sendInFlight && c->queue.front().req.get() == &r) return true;
        if (c->recvInFlight && c->target && c->target->req.get() == &r && !c->target->heap) {
          return true;
        }
      }
    }
    return false;
  }

  const TransportOptions o_;
  const std::chrono::microseconds spin_{o_.config.spinUs};  // NANOCCL_SPIN_US
  std::vector<Listener> listeners_;  // one a rail; closed once connected
  int rails_ = 1;
  Rails railLayout_;  // the rails' weights: weighRails() (layout.h)
  // Payload bytes per rail (frames sent, frames landed): written by the progress thread.
  std::unique_ptr<std::atomic<uint64_t>[]> railSent_, railReceived_;
  std::unique_ptr<IoEngine> engine_;
  std::vector<std::vector<std::unique_ptr<Conn>>> peers_;
  std::thread thread_;

  std::mutex mu_;  // guards commands_, failedPublic_
  std::deque<Command> commands_;
  std::atomic<bool> commandsWaiting_{false};  // commands_ is not empty (read while spinning)
  DrainedFlag drained_;  // abort() waits for it
  Status failedPublic_;

  TransportCounters counters_;

  // Progress-thread state.
  Status failed_;
  std::optional<Matcher> matcher_;  // made by connect(), once the rails are known
  struct Closing {
    Status why;
    Clock::time_point until;
  };
  std::optional<Closing> closing_;  // failOnClose()
  std::vector<std::shared_ptr<BasicRequest>> parked_;
};

}  // namespace

Result<std::unique_ptr<Transport>> createTcpTransport(const TransportOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return invalidArgument("tcp transport: rank " + std::to_string(options.rank) +
                           " outside a communicator of size " + std::to_string(options.size));
  }
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(options));
}

}  // namespace nanoccl::tcp
