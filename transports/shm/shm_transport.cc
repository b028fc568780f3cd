#include "transports/shm/shm_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <vector>

#include "common/logging.h"
#include "transports/engine.h"
#include "transports/frame.h"
#include "transports/shm/board.h"
#include "transports/shm/segment.h"

namespace nanoccl::shm {
namespace {

// How long the progress thread polls its doorbell before it sleeps on it (with a call in
// flight, or up to NANOCCL_SPIN_US after the last one moved, the engine first polls that long,
// yielding).
constexpr auto kSpin = std::chrono::microseconds(5);

using RequestPtr = EngineRequestPtr;

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

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class ShmTransport : public EngineTransport {
 public:
  explicit ShmTransport(const TransportOptions& o)
      : EngineTransport(o, {.name = "shm", .drivable = true}),
        peers_(static_cast<size_t>(o.size)) {}

  ~ShmTransport() override {
    stopEngine();
    if (own_) {
      // Peers that still read from us (or wait for us in connect) learn we are gone.
      uint32_t open = static_cast<uint32_t>(SegmentState::kOpen);
      own_->header().state.compare_exchange_strong(open,
                                                   static_cast<uint32_t>(SegmentState::kClosed),
                                                   std::memory_order_release);
      ringPeers();
    }
  }

  Result<std::string> publish() override {
    removeStaleSegments();
    NANOCCL_ASSIGN_OR_RETURN(own_, Segment::create(identity()));
    bell_ = &own_->header().bell;
    return own_->name();
  }

  Status attach(const std::vector<std::string>& addresses, const Deadline& deadline) override {
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
    return Status::ok();
  }

  std::shared_ptr<Request> isend(int peer, const Envelope& env, const void* buf,
                                 size_t bytes) override {
    noteMessageCall(env);
    return EngineTransport::isend(peer, env, buf, bytes);
  }
  std::shared_ptr<Request> irecv(int peer, const Envelope& env, void* buf,
                                 size_t bytes) override {
    noteMessageCall(env);
    return EngineTransport::irecv(peer, env, buf, bytes);
  }

  Board* board() override { return o_.size > 1 && engine_.isOpen() ? &board_ : nullptr; }

  std::string describe() const override {
    return "shm " + std::to_string(kRingChunks) + "x" + std::to_string(kChunkBytes >> 10) + "KiB";
  }

 private:
  Segment::Identity identity() const {
    return Segment::Identity{o_.rank, o_.size, CommIdentity(o_.secret, o_.commId)};
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
  // that owns the segment at the time (connect()'s caller, then whoever holds progress).
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
        return timeoutError(engine_.me() + "shared-memory setup timed out waiting for rank(s) " +
                            missing + " to map this rank's segment (did every rank of this host "
                            "reach connect()?)");
      }
      const auto left = std::chrono::milliseconds(deadline.remainingMs(100));
      bell_->sleep(seen, std::max<std::chrono::microseconds>(left, std::chrono::microseconds(1)));
    }
  }

  // ---- the Mover (engine.h): with the engine's progress held, but wake/arm/rung/wait -----

  void startSend(const RequestPtr& req) override {
    Peer& peer = peers_[req->peer];
    if (peer.closed) {
      engine_.fail(peerState(req->peer), true);
      return req->complete(engine_.failed(), -1);
    }
    req->framesLeft = 1;  // the message goes out chunk by chunk, but completes once
    peer.sendQueue.push_back(req);
    pumpTx(req->peer);  // a small send is in the peer's ring before isend() returns
  }

  // One pass over every ring in and out, the peers' states, and every kLivenessPeriod their
  // processes.
  bool progress() override {
    bool progressed = false;
    for (int p = 0; p < o_.size && ok(); ++p) {
      if (p != o_.rank) progressed = pumpRx(p) || progressed;
    }
    for (int p = 0; p < o_.size && ok(); ++p) {
      if (p != o_.rank) progressed = pumpTx(p) || progressed;
    }
    if (ok()) checkPeerStates();
    if (ok() && Clock::now() >= nextProbe()) {
      probePeers();
      nextProbe_.store((Clock::now() + kLivenessPeriod).time_since_epoch().count(),
                       std::memory_order_relaxed);
    }
    return progressed;
  }

  // Sleeps on this rank's doorbell (rung by arrivals, freed ring space and posted commands)
  // until it rings after arm(), `d` passes or the peers' processes are due a probe; polls it
  // for kSpin first.
  bool wait(std::chrono::microseconds d) override {
    const auto spinUntil = Clock::now() + kSpin;
    while (Clock::now() < spinUntil) {
      for (int i = 0; i < 16; ++i) cpuRelax();
      if (rung()) return true;
    }
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(nextProbe() - Clock::now());
    left = std::clamp<std::chrono::microseconds>(std::min(left, d), std::chrono::microseconds(1),
                                                 kLivenessPeriod);
    bell_->sleep(seen_, left);
    return rung();
  }
  void wake() override { bell_->ring(); }
  void arm() override { seen_ = bell_->seq.load(std::memory_order_acquire); }
  bool rung() const override { return bell_->seq.load(std::memory_order_relaxed) != seen_; }

  bool sendsPending() const override {
    for (const Peer& p : peers_) {
      if (!p.sendQueue.empty()) return true;
    }
    return false;
  }
  // Copies run with progress held: none is in flight once the engine has it.
  bool busy(const BasicRequest*) const override { return false; }

  // The board fails too; if asked, the peers are told through this segment.
  void onFail(const Status& why, bool notifyPeers, RequestList& out) override {
    board_.fail(why);
    if (notifyPeers) {
      publishAbort(why.message());
      ringPeers();
    }
    for (Peer& p : peers_) {
      out.insert(out.end(), p.sendQueue.begin(), p.sendQueue.end());
      p.sendQueue.clear();
    }
  }

  bool ok() const { return engine_.failed().isOk(); }
  Clock::time_point nextProbe() const {
    return Clock::time_point(Clock::duration(nextProbe_.load(std::memory_order_relaxed)));
  }

  FrameHeader chunkFor(const EngineRequest& req, uint64_t offset, uint64_t length) const {
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
      EngineRequest& req = *peer.sendQueue.front();
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
        engine_.frameSent(done);
        if (!ok()) break;  // its callback aborted the transport
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
    for (uint32_t n = 0; n < kRingChunks && ok(); ++n) {
      const uint64_t head = rc.head.value.load(std::memory_order_acquire);
      if (head == peer.tail) break;
      if (head - peer.tail > kRingChunks) {
        engine_.failFrom(p, protocolError("the ring is corrupt (head " + std::to_string(head) +
                                          ", tail " + std::to_string(peer.tail) + ")"));
        break;
      }
      const uint64_t slot = peer.tail % kRingChunks;
      FrameHeader h;  // a private copy: the sender's memory is not trusted twice
      std::memcpy(&h, own_->chunkHeader(p, slot), sizeof(h));
      if (!engine_.matcher().midMessage(p, 0) && !peer.deferred && !engine_.matcher().hasReceiveFor(p, h)) {
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
    if (!st.isOk()) return engine_.failFrom(p, st);
    engine_.land(p, 0, h, data);
  }

  void checkPeerStates() {
    for (int p = 0; p < o_.size && ok(); ++p) {
      if (p == o_.rank || peers_[p].closed) continue;
      const Status st = peerState(p);
      if (st.isOk()) continue;
      const auto state = peers_[p].seg->header().state.load(std::memory_order_acquire);
      if (state != static_cast<uint32_t>(SegmentState::kClosed)) {
        engine_.fail(st, true);  // aborted: its reason is the error
        continue;
      }
      // Like a tcp connection closed in order: what the peer sent is still delivered, and the
      // transport fails only if something still waits on the peer (a rank that finished its
      // last call and exited is no error for the ranks still finishing theirs).
      while (ok() && pumpRx(p)) {
      }
      peers_[p].closed = true;
      if (!engine_.laneClosed(p, 0) && ok() && !peers_[p].sendQueue.empty()) {
        engine_.fail(st, true);
      }
    }
  }

  void probePeers() {
    for (int p = 0; p < o_.size && ok(); ++p) {
      if (p == o_.rank || peers_[p].closed) continue;  // gone in order (checkPeerStates)
      if (probe(peers_[p].identity) == Liveness::kDead) engine_.fail(deadPeer(p), true);
    }
  }

  std::unique_ptr<Segment> own_;  // this rank's segment: the rings to us and our doorbell
  Doorbell localBell_{};          // a world of one has no segment
  Doorbell* bell_ = &localBell_;
  std::vector<Peer> peers_;

  // When the peers' processes are next probed: set in progress() (progress held), read by
  // wait() (the progress thread, without it).
  std::atomic<Clock::rep> nextProbe_{(Clock::now() + kLivenessPeriod).time_since_epoch().count()};
  uint32_t seen_ = 0;  // the doorbell at arm() (the progress thread's)

  ShmBoard board_{o_.rank, o_.size, std::chrono::microseconds(o_.config.spinUs),
                  engine_.peerCounters()};  // board(), once connected
};

}  // namespace

Result<std::unique_ptr<Transport>> createShmTransport(const TransportOptions& options) {
  return std::unique_ptr<Transport>(std::make_unique<ShmTransport>(options));
}

}  // namespace nanoccl::shm
