#include "transports/shm/shm_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/spin.h"
#include "common/thread_name.h"
#include "transports/matcher.h"
#include "transports/transport_common.h"
#include "transports/request.h"
#include "transports/shm/board.h"
#include "transports/shm/segment.h"
#include "transports/frame.h"

namespace nanoccl::shm {
namespace {

// How long an idle progress thread polls its doorbell before it sleeps on it (with a call in
// flight, or up to NANOCCL_SPIN_US after the last one moved: that long, yielding).
constexpr auto kSpin = std::chrono::microseconds(5);

class ShmTransport;

class ShmRequest : public BasicRequest {
 public:
  ShmRequest(ShmTransport* transport, bool isSend, int peer, const Envelope& env, char* buf,
             size_t bytes)
      : BasicRequest(isSend, peer, env, buf, bytes), transport_(transport) {}
  // Drives the transport's progress on this thread first (ShmTransport::drive), then sleeps.
  // Must not race with the transport's destruction (the communicator's calls do not).
  Status wait(const Deadline& deadline) override;
  uint64_t wireSeq = 0;  // send: the header's seq (the call's, or the p2p message number)

 private:
  ShmTransport* const transport_;
};
using RequestPtr = std::shared_ptr<ShmRequest>;

struct Peer {
  std::unique_ptr<Segment> seg;  // the peer's segment: our ring to it and its doorbell
  ProcessIdentity identity;
  // Send side: messages go out whole and in posting order, one chunk at a time.
  std::deque<RequestPtr> sendQueue;
  uint64_t sentBytes = 0;  // of sendQueue.front()
  uint64_t head = 0;       // the outgoing ring's head; this thread is its only writer
  // Receive side: the ring from this peer, in our segment.
  uint64_t tail = 0;
  bool deferred = false;  // the next message found no receive once: commands get a look first
  // The peer closed its transport and everything it sent has been read: what arrived stays
  // receivable, anything still expected from it (or queued for it) fails.
  bool closed = false;
};

enum class CommandKind { kSend, kRecv, kAbort, kStop };
struct Command {
  CommandKind kind;
  RequestPtr req;
  Status why;
};

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class ShmTransport : public Transport {
 public:
  explicit ShmTransport(const TransportOptions& o)
      : o_(o),
        peers_(static_cast<size_t>(o.size)),
        counters_(o.size),
        matcher_(matcherOptions()) {}

  ~ShmTransport() override {
    if (thread_.joinable()) {
      post({CommandKind::kStop, nullptr,
            abortedError("rank " + std::to_string(o_.rank) + ": communicator destroyed")});
      thread_.join();
    }
    if (own_) {
      // Peers that still read from us (or wait for us in connect) learn we are gone.
      uint32_t open = static_cast<uint32_t>(SegmentState::kOpen);
      own_->header().state.compare_exchange_strong(open,
                                                   static_cast<uint32_t>(SegmentState::kClosed),
                                                   std::memory_order_release);
      ringPeers();
    }
  }

  Result<std::string> listen() override {
    if (o_.size == 1) return std::string();
    if (own_) return invalidArgument("rank " + std::to_string(o_.rank) + ": listen() called twice");
    removeStaleSegments();
    NANOCCL_ASSIGN_OR_RETURN(own_, Segment::create(identity()));
    bell_ = &own_->header().bell;
    return own_->name();
  }

  Status connect(const std::vector<std::string>& addresses, const Deadline& deadline) override {
    if (thread_.joinable()) return invalidArgument("connect() called twice");
    if (o_.size > 1) {
      if (!own_) {
        return invalidArgument("rank " + std::to_string(o_.rank) + ": connect() before listen()");
      }
      if (addresses.size() != static_cast<size_t>(o_.size)) {
        return invalidArgument("rank " + std::to_string(o_.rank) + ": " +
                               std::to_string(addresses.size()) + " addresses for " +
                               std::to_string(o_.size) + " ranks");
      }
      if (Status st = attachAll(addresses, deadline); !st.isOk()) {
        // Peers that mapped us, or will, fail at once with the reason instead of waiting. The
        // name stays until this transport is destroyed, so that slower peers read the reason
        // rather than find nothing.
        publishAbort(st.message());
        ringPeers();
        return st;
      }
      // Every peer holds a mapping: the name is no longer needed by anyone.
      own_->unlink();
      std::vector<ShmBoard::Peer> boardPeers(peers_.size());
      for (size_t p = 0; p < peers_.size(); ++p) {
        boardPeers[p] = {peers_[p].seg.get(), peers_[p].identity};
      }
      board_.connect(own_.get(), std::move(boardPeers));
    }
    NANOCCL_INFO("rank " << o_.rank << ": " << describe() << " connected to " << o_.size - 1
                         << " peers");
    thread_ = namedThread("shm", [this] { progressLoop(); });
    connected_.store(true, std::memory_order_release);
    return Status::ok();
  }

  std::shared_ptr<Request> isend(int peer, const Envelope& env, const void* buf,
                                 size_t bytes) override {
    noteMessageCall(env);
    auto req = std::make_shared<ShmRequest>(
        this, true, peer, env, const_cast<char*>(static_cast<const char*>(buf)), bytes);
    return startRequest(std::move(req), o_.rank, o_.size,
                        connected_.load(std::memory_order_acquire),
                        [&](const auto& r) { post({CommandKind::kSend, r, {}}); });
  }

  std::shared_ptr<Request> irecv(int peer, const Envelope& env, void* buf,
                                 size_t bytes) override {
    noteMessageCall(env);
    auto req =
        std::make_shared<ShmRequest>(this, false, peer, env, static_cast<char*>(buf), bytes);
    return startRequest(std::move(req), o_.rank, o_.size,
                        connected_.load(std::memory_order_acquire),
                        [&](const auto& r) { post({CommandKind::kRecv, r, {}}); });
  }

  void abort(const Status& why) override {
    if (!thread_.joinable()) return;
    if (holdsProgress()) {
      fail(why, true);  // from a completion callback, which runs with progressMu_ held
      return;
    }
    post({CommandKind::kAbort, nullptr, why});
    // The progress thread (or a waiter driving it) handles the command between two chunk
    // copies: copies touch callers' buffers only there, so once it has, none is touched.
    if (!drained_.waitFor(std::chrono::seconds(5))) {
      NANOCCL_WARN("rank " << o_.rank << ": shm: abort is not handled after 5 s (the progress "
                   "thread is stuck, in a callback say); the pending requests stay pending "
                   "until it is, so their buffers are not released early");
    }
  }

  std::vector<PeerCounters> counters() const override { return counters_.snapshot(); }

  Board* board() override {
    return o_.size > 1 && connected_.load(std::memory_order_acquire) ? &board_ : nullptr;
  }

  std::string describe() const override {
    return "shm " + std::to_string(kRingChunks) + "x" + std::to_string(kChunkBytes >> 10) + "KiB";
  }

 private:
  Segment::Identity identity() const {
    return Segment::Identity{o_.rank, o_.size, CommIdentity(o_.secret, o_.commId)};
  }

  // One lane per peer (its ring), which carries every message whole, chunk by chunk in order.
  MatcherOptions matcherOptions() {
    MatcherOptions mo = matcherOptionsFor(o_, &counters_);
    mo.lanes = 1;
    mo.parts = [](OpType, uint64_t, uint32_t, uint64_t total, int) {
      return std::vector<Part>{{0, 0, total}};
    };
    mo.landsInOrder = true;
    return mo;
  }

  void post(Command cmd) {
    if (runOnPostingThread(cmd)) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands_.push_back(std::move(cmd));
    }
    bell_->ring();
  }

  // Runs a send or receive on the posting thread where it can (no one holds progressMu_, no
  // command is queued before it): posting then wakes no thread, and a small send is in the
  // peer's ring before isend() returns. The progress thread is rung only for what is left
  // (a send that did not fit): arrivals ring it themselves.
  bool runOnPostingThread(const Command& cmd) {
    if (spin_.count() <= 0 || (cmd.kind != CommandKind::kSend && cmd.kind != CommandKind::kRecv) ||
        holdsProgress()) {  // a completion callback posting: its step is still running
      return false;
    }
    std::unique_lock<std::mutex> lock(progressMu_, std::try_to_lock);
    if (!lock.owns_lock() || stopping_) return false;
    {
      std::lock_guard<std::mutex> queued(mu_);
      if (!commands_.empty()) return false;  // they go first
    }
    driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    if (cmd.kind == CommandKind::kSend) {
      startSend(cmd.req);
      if (failed_.isOk()) pumpTx(cmd.req->peer);
    } else {
      startRecv(cmd.req);
    }
    driver_.store(std::thread::id(), std::memory_order_relaxed);
    bool leftWork = false;
    for (const Peer& p : peers_) leftWork = leftWork || !p.sendQueue.empty();
    lock.unlock();
    if (leftWork) bell_->ring();
    return true;
  }

  // Whether this thread is in a step (the progress thread, or a driver): it holds progressMu_.
  bool holdsProgress() const {
    const std::thread::id me = std::this_thread::get_id();
    return me == thread_.get_id() || driver_.load(std::memory_order_relaxed) == me;
  }

  // A collective message posted: peers waiting for this call on the board learn that this
  // rank runs it with messages (SegmentHeader::messageCall).
  void noteMessageCall(const Envelope& env) {
    if (!own_ || env.fingerprint.op == OpType::kSendRecv) return;
    own_->header().messageCall.store(env.fingerprint.seq + 1, std::memory_order_release);
  }

  // Both bells of every peer: its progress thread and its board waiter.
  void ringPeers() {
    for (auto& p : peers_) {
      if (!p.seg) continue;
      p.seg->header().bell.ring();
      p.seg->header().boardBell.ring();
    }
  }

  // Writes the reason into this rank's segment for its peers to read. Called by the one thread
  // that owns the segment at the time (connect()'s caller, then the progress thread).
  void publishAbort(const std::string& why) {
    if (!own_) return;
    SegmentHeader& h = own_->header();
    if (h.state.load(std::memory_order_relaxed) != static_cast<uint32_t>(SegmentState::kOpen)) {
      return;
    }
    const size_t n = std::min<size_t>(why.size(), kMaxAbortText);
    std::memcpy(h.abortText, why.data(), n);
    h.abortLength = static_cast<uint32_t>(n);
    h.state.store(static_cast<uint32_t>(SegmentState::kAborted), std::memory_order_release);
  }

  // kPeerError if peer `p` marked its segment aborted or closed, else OK.
  Status peerState(int p) { return peerSegmentState(o_.rank, p, peers_[p].seg->header()); }

  Status deadPeer(int p) const {
    return deadPeerError(o_.rank, p, peers_[p].identity.pid);
  }

  // Maps every peer's segment, announces it in the peer's ring control, and waits until every
  // peer has done the same with ours.
  Status attachAll(const std::vector<std::string>& addresses, const Deadline& deadline) {
    bool foreignNamespace = false;
    for (int p = 0; p < o_.size; ++p) {
      if (p == o_.rank) continue;
      Peer& peer = peers_[p];
      NANOCCL_ASSIGN_OR_RETURN(peer.seg, Segment::attach(addresses[p], p, identity()));
      const SegmentHeader& h = peer.seg->header();
      peer.identity = ProcessIdentity{h.pid, h.startTime, h.pidNamespace};
      foreignNamespace = foreignNamespace || probe(peer.identity) == Liveness::kUnknown;
      NANOCCL_CHECK(peerState(p));
      peer.seg->control(o_.rank).attached.value.store(1, std::memory_order_release);
      peer.seg->header().bell.ring();
    }
    if (foreignNamespace) {
      NANOCCL_INFO("rank " << o_.rank << ": some peers run in another pid namespace: their "
                              "death is seen only when they close their transport");
    }
    while (true) {
      const uint32_t seen = bell_->seq.load(std::memory_order_acquire);
      std::string missing;
      for (int p = 0; p < o_.size; ++p) {
        if (p == o_.rank) continue;
        // A peer that mapped us may already be done, and even gone: the progress thread
        // delivers what it sent, then reports it.
        if (own_->control(p).attached.value.load(std::memory_order_acquire) != 0) continue;
        NANOCCL_CHECK(peerState(p));
        if (probe(peers_[p].identity) == Liveness::kDead) return deadPeer(p);
        missing += std::string(missing.empty() ? "" : ", ") + std::to_string(p);
      }
      if (missing.empty()) return Status::ok();
      if (deadline.expired()) {
        return timeoutError("rank " + std::to_string(o_.rank) +
                            ": shared-memory setup timed out waiting for rank(s) " + missing +
                            " to map this rank's segment (did every rank of this host reach "
                            "connect()?)");
      }
      const auto left = std::chrono::milliseconds(deadline.remainingMs(100));
      bell_->sleep(seen, std::max<std::chrono::microseconds>(left, std::chrono::microseconds(1)));
    }
  }

  // ---- progress thread ----------------------------------------------------------------

  // One pass over everything: commands, every ring in and out, the peers' states (and their
  // processes, if `probe`). With progressMu_ held. Returns whether anything moved.
  bool step(bool probe) {
    bool progressed = runCommands();
    if (stopping_) return progressed;
    if (failed_.isOk()) {
      for (int p = 0; p < o_.size && failed_.isOk(); ++p) {
        if (p != o_.rank) progressed = pumpRx(p) || progressed;
      }
      for (int p = 0; p < o_.size && failed_.isOk(); ++p) {
        if (p != o_.rank) progressed = pumpTx(p) || progressed;
      }
      checkPeerStates();
      if (failed_.isOk() && probe) probePeers();
    }
    updateDrained();
    return progressed;
  }

 public:
  // Runs progress steps on the calling thread until `done()` or NANOCCL_SPIN_US without
  // anything moving, yielding between steps; while the progress thread (or another waiter)
  // holds progressMu_, only yields. A thread that waits on a request drives its own call this
  // way, instead of handing each chunk to the progress thread and back: the progress thread
  // sleeps between calls, and waking it costs more than a small message's whole transfer.
  template <typename Done>
  void drive(Done&& done) {
    if (!connected_.load(std::memory_order_acquire) || holdsProgress()) return;
    Clock::time_point until = Clock::now() + spin_;
    bool leftWork = false;  // pending requests after this thread's last step
    while (!done() && Clock::now() < until) {
      std::unique_lock<std::mutex> lock(progressMu_, std::try_to_lock);
      if (lock.owns_lock()) {
        if (stopping_) return;
        driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
        const bool progressed = step(false);
        driver_.store(std::thread::id(), std::memory_order_relaxed);
        leftWork = failed_.isOk() && hasPending();
        lock.unlock();
        if (progressed) {
          // Not lastBusy_: the progress thread need not linger for a call its waiter drives.
          until = Clock::now() + spin_;
          continue;
        }
      }
      std::this_thread::yield();
    }
    // The progress thread backs off while a waiter drives (progressLoop): hand it what is left.
    if (leftWork) bell_->ring();
  }

 private:
  void progressLoop() {
    auto nextProbe = Clock::now() + kLivenessPeriod;
    while (true) {
      // Anything rung after this snapshot makes the sleep below return at once.
      const uint32_t seen = bell_->seq.load(std::memory_order_acquire);
      bool progressed;
      bool healthy;
      bool pending;
      {
        std::unique_lock<std::mutex> lock(progressMu_, std::try_to_lock);
        if (!lock.owns_lock()) {
          // A waiter drives (drive()); it rings this bell if it leaves work behind. Blocking
          // on the mutex instead would make each of its steps wake this thread.
          bell_->sleep(seen, kLivenessPeriod);
          continue;
        }
        const bool probe = Clock::now() >= nextProbe;
        progressed = step(probe);
        if (stopping_) return;
        if (probe) nextProbe = Clock::now() + kLivenessPeriod;
        healthy = failed_.isOk();
        pending = healthy && hasPending();
      }
      if (progressed) {
        lastBusy_.store(Clock::now().time_since_epoch().count());
        continue;
      }
      const auto rung = [&] { return bell_->seq.load(std::memory_order_relaxed) != seen; };
      const Clock::time_point lastBusy{Clock::duration(lastBusy_.load())};
      const Clock::time_point waitStart = Clock::now();
      if (healthy && (pending || waitStart < lastBusy + spin_)) {
        // A call is in flight, or one just ended and the next of back-to-back calls is due:
        // its chunk or command comes soon (common/spin.h), if the recent ones of a call in
        // flight did (SpinPolicy).
        const bool found = spinFor(pending ? SpinPolicy::budget(spin_) : spin_, rung);
        if (found) {
          if (pending) SpinPolicy::record(spin_, Clock::now() - waitStart);
          continue;
        }
      } else {
        const auto spinUntil = Clock::now() + kSpin;
        bool early = false;
        while (!early && Clock::now() < spinUntil) {
          for (int i = 0; i < 16; ++i) cpuRelax();
          early = rung();
        }
        if (early) continue;
      }
      auto wait = std::chrono::duration_cast<std::chrono::microseconds>(nextProbe - Clock::now());
      if (!healthy) wait = kLivenessPeriod;  // nothing left to watch: only commands
      wait = std::clamp<std::chrono::microseconds>(wait, std::chrono::microseconds(1),
                                                   kLivenessPeriod);
      bell_->sleep(seen, wait);
      if (pending) SpinPolicy::record(spin_, Clock::now() - waitStart);
    }
  }

  bool runCommands() {
    std::deque<Command> cmds;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cmds.swap(commands_);
    }
    for (auto& cmd : cmds) {
      switch (cmd.kind) {
        case CommandKind::kSend: startSend(cmd.req); break;
        case CommandKind::kRecv: startRecv(cmd.req); break;
        case CommandKind::kAbort: fail(cmd.why, true); break;
        case CommandKind::kStop:
          stopping_ = true;
          // Peers hear the reason only if this rank still had work pending; otherwise the
          // destructor marks the segment closed, like a tcp connection closing.
          fail(cmd.why, hasPending());
          break;
      }
    }
    return !cmds.empty();
  }

  void startSend(const RequestPtr& req) {
    if (!failed_.isOk()) return req->complete(failed_, -1);
    Peer& peer = peers_[req->peer];
    if (peer.closed) {
      fail(peerState(req->peer), true);
      return req->complete(failed_, -1);
    }
    req->wireSeq = matcher_.wireSeq(*req);
    peer.sendQueue.push_back(req);
  }

  FrameHeader chunkFor(const ShmRequest& req, uint64_t offset, uint64_t length) const {
    return dataFrameHeader(req.env.fingerprint, req.env.tag, req.wireSeq, req.bytes, offset,
                           length);
  }

  // Writes as many chunks of the queued sends to `p` as its ring has room for.
  bool pumpTx(int p) {
    Peer& peer = peers_[p];
    if (peer.sendQueue.empty()) return false;
    RingControl& rc = peer.seg->control(o_.rank);
    Doorbell& bell = peer.seg->header().bell;
    uint64_t tail = rc.tail.value.load(std::memory_order_acquire);
    bool progressed = false;
    // At most a ring's worth per call, so that commands (abort) and other peers get their turn.
    for (uint32_t n = 0; n < kRingChunks && !peer.sendQueue.empty(); ++n) {
      if (peer.head - tail >= kRingChunks) {
        tail = rc.tail.value.load(std::memory_order_acquire);
        if (peer.head - tail >= kRingChunks) {
          // Full: ask to be rung when a chunk is freed, then look once more (a chunk freed
          // before the request was seen would ring nobody).
          rc.senderWaiting.value.store(1, std::memory_order_seq_cst);
          tail = rc.tail.value.load(std::memory_order_seq_cst);
          if (peer.head - tail >= kRingChunks) break;
        }
      }
      ShmRequest& req = *peer.sendQueue.front();
      const uint64_t slot = peer.head % kRingChunks;
      const uint64_t len = std::min<uint64_t>(kChunkBytes, req.bytes - peer.sentBytes);
      const FrameHeader h = chunkFor(req, peer.sentBytes, len);
      std::memcpy(peer.seg->chunkHeader(o_.rank, slot), &h, sizeof(h));
      if (len > 0) std::memcpy(peer.seg->chunkData(o_.rank, slot), req.buf + peer.sentBytes, len);
      rc.head.value.store(++peer.head, std::memory_order_release);
      bell.ring();
      peer.sentBytes += len;
      progressed = true;
      if (peer.sentBytes == req.bytes) {
        RequestPtr done = std::move(peer.sendQueue.front());
        peer.sendQueue.pop_front();
        peer.sentBytes = 0;
        counters_.sent(p, done->bytes);
        done->complete(Status::ok(), o_.rank);
        if (!failed_.isOk()) break;  // its callback aborted the transport
      }
    }
    return progressed;
  }

  // Consumes the chunks `p` has published in its ring to us.
  bool pumpRx(int p) {
    Peer& peer = peers_[p];
    RingControl& rc = own_->control(p);
    bool progressed = false;
    // At most a ring's worth per call, so that commands (abort) and other peers get their turn.
    for (uint32_t n = 0; n < kRingChunks && failed_.isOk(); ++n) {
      const uint64_t head = rc.head.value.load(std::memory_order_acquire);
      if (head == peer.tail) break;
      if (head - peer.tail > kRingChunks) {
        fail(protocolError("rank " + std::to_string(o_.rank) + ": the ring from rank " +
                           std::to_string(p) + " is corrupt (head " + std::to_string(head) +
                           ", tail " + std::to_string(peer.tail) + ")"),
             true);
        break;
      }
      const uint64_t slot = peer.tail % kRingChunks;
      FrameHeader h;  // a private copy: the sender's memory is not trusted twice
      std::memcpy(&h, own_->chunkHeader(p, slot), sizeof(h));
      if (!matcher_.midMessage(p, 0) && !peer.deferred && !matcher_.hasReceiveFor(p, h)) {
        // Its receive may sit in the command queue (posted just before the send): look there
        // before holding the message in a buffer of its own, which costs a copy and page faults.
        peer.deferred = true;
        return true;
      }
      peer.deferred = false;
      onChunk(p, h, own_->chunkData(p, slot));
      rc.tail.value.store(++peer.tail, std::memory_order_seq_cst);
      // A waiting sender is rung once half the ring is free (this loop drains it that far, at
      // least): it then refills several chunks per wake-up while we copy out the rest.
      if (head - peer.tail <= kRingChunks / 2 &&
          rc.senderWaiting.value.load(std::memory_order_seq_cst) != 0 &&
          rc.senderWaiting.value.exchange(0, std::memory_order_seq_cst) != 0) {
        peer.seg->header().bell.ring();
      }
      progressed = true;
    }
    return progressed;
  }

  void onChunk(int p, const FrameHeader& h, const char* data) {
    Status st = validateFrameHeader(h);
    if (st.isOk() && h.kind != FrameKind::kData) st = protocolError("non-data frame in a ring");
    if (st.isOk() && h.length != std::min<uint64_t>(kChunkBytes, h.total - h.offset)) {
      st = protocolError("chunk of " + std::to_string(h.length) + " bytes at offset " +
                         std::to_string(h.offset) + " of a " + std::to_string(h.total) +
                         "-byte message");
    }
    if (!st.isOk()) {
      return fail(st.withContext("rank " + std::to_string(o_.rank) + ": from rank " +
                                 std::to_string(p) + ": "),
                  true);
    }
    Result<Matcher::IncomingPtr> msg = matcher_.onFrame(p, 0, h);
    if (!msg.isOk()) return fail(msg.status(), true);
    if (h.length > 0) std::memcpy(msg.value()->dest(h.offset), data, h.length);
    matcher_.landed(msg.value(), h.length);
  }

  void startRecv(const RequestPtr& req) {
    if (!failed_.isOk()) return req->complete(failed_, -1);
    if (Status st = matcher_.postRecv(req); !st.isOk()) {
      fail(st, true);
      req->complete(failed_, -1);  // held by no table: fail() cannot see it
    }
  }

  void checkPeerStates() {
    for (int p = 0; p < o_.size && failed_.isOk(); ++p) {
      if (p == o_.rank || peers_[p].closed) continue;
      const Status st = peerState(p);
      if (st.isOk()) continue;
      const auto state = peers_[p].seg->header().state.load(std::memory_order_acquire);
      if (state != static_cast<uint32_t>(SegmentState::kClosed)) {
        fail(st, true);  // aborted: its reason is the error
        continue;
      }
      // Like a tcp connection closed in order: what the peer sent is still delivered, and the
      // transport fails only if something still waits on the peer (a rank that finished its
      // last call and exited is no error for the ranks still finishing theirs).
      while (failed_.isOk() && pumpRx(p)) {
      }
      peers_[p].closed = true;
      counters_.closed(p);
      const bool needed = matcher_.laneClosed(p, 0) != nullptr || !peers_[p].sendQueue.empty();
      if (failed_.isOk() && needed) fail(st, true);
    }
  }

  void probePeers() {
    for (int p = 0; p < o_.size && failed_.isOk(); ++p) {
      if (p == o_.rank || peers_[p].closed) continue;  // gone in order (checkPeerStates)
      if (probe(peers_[p].identity) == Liveness::kDead) fail(deadPeer(p), true);
    }
  }

  bool hasPending() const {
    if (matcher_.hasPending()) return true;
    for (const Peer& p : peers_) {
      if (!p.sendQueue.empty()) return true;
    }
    return false;
  }

  void updateDrained() {
    if (failed_.isOk()) return;
    drained_.set();
  }

  // Fails the transport: every pending request completes with `why` (no copy is in progress:
  // copies run on this thread), and, if asked, the peers are told through this segment.
  void fail(const Status& why, bool notifyPeers) {
    if (!failed_.isOk()) return;
    failed_ = why;
    board_.fail(why);
    logTransportFailure(o_.rank, why, hasPending());
    if (notifyPeers) {
      publishAbort(why.message());
      ringPeers();
    }
    // Take everything out of the tables first: callbacks run below may post new requests.
    std::vector<std::shared_ptr<BasicRequest>> pending = matcher_.takeAll();
    for (Peer& p : peers_) {
      for (auto& r : p.sendQueue) pending.push_back(r);
      p.sendQueue.clear();
    }
    for (auto& r : pending) r->complete(why, -1);
    updateDrained();
  }

  const TransportOptions o_;
  const std::chrono::microseconds spin_{o_.config.spinUs};  // NANOCCL_SPIN_US
  std::unique_ptr<Segment> own_;  // this rank's segment: the rings to us and our doorbell
  Doorbell localBell_{};          // a world of one has no segment
  Doorbell* bell_ = &localBell_;
  std::vector<Peer> peers_;
  std::thread thread_;
  std::atomic<bool> connected_{false};

  // Held by whoever moves bytes: the progress thread (step()), a thread driving its wait
  // (drive()) or one posting (runOnPostingThread()). Everything below "Progress state" belongs
  // to its holder.
  std::mutex progressMu_;
  std::atomic<std::thread::id> driver_{};  // the thread other than thread_ in a step
  std::atomic<Clock::rep> lastBusy_{0};    // when the progress thread's step last moved something
  std::mutex mu_;  // guards commands_
  std::deque<Command> commands_;
  DrainedFlag drained_;  // abort() waits for it

  TransportCounters counters_;

  ShmBoard board_{o_.rank, o_.size, spin_, counters_};  // board(), once connected

  // Progress state (progressMu_).
  bool stopping_ = false;  // the destructor's kStop was run
  Status failed_;
  Matcher matcher_;  // receives, held messages and their checks
};

Status ShmRequest::wait(const Deadline& deadline) {
  if (!test()) transport_->drive([this] { return test(); });
  return BasicRequest::wait(deadline);
}

}  // namespace

Result<std::unique_ptr<Transport>> createShmTransport(const TransportOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return invalidArgument("shm transport: rank " + std::to_string(options.rank) +
                           " outside a communicator of size " + std::to_string(options.size));
  }
  return std::unique_ptr<Transport>(std::make_unique<ShmTransport>(options));
}

}  // namespace nanoccl::shm
