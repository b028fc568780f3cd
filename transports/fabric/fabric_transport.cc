#include "transports/fabric/fabric_transport.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/crypto.h"
#include "common/logging.h"
#include "transports/engine.h"
#include "transports/fabric/address.h"
#include "transports/fabric/endpoint.h"
#include "transports/fabric/wire.h"
#include "transports/identity.h"

namespace nanoccl::fabric {
namespace {

constexpr int kRecvBuffers = 64;  // bounce buffers kept posted
constexpr int kSendWindow = 64;   // frames in flight per peer
constexpr auto kPingPeriod = std::chrono::milliseconds(250);
// How long abort() waits for sends the provider still reads from callers' buffers, and a
// destroyed transport for its last frames (close, abort) to leave.
constexpr auto kDrainBound = std::chrono::seconds(10);
constexpr auto kCloseBound = std::chrono::seconds(2);

using RequestPtr = EngineRequestPtr;

// One operation the provider holds; fi_context first (FI_CONTEXT mode).
struct OpCtx {
  fi_context ctx{};
  bool isSend = false;
  int peer = -1;
  // Send: the header (and an abort text, or the whole frame where the provider takes one
  // iov only); `req` is null for control frames.
  WireHeader hdr{};
  std::string extra;
  RequestPtr req;
  // Receive: a bounce buffer.
  std::unique_ptr<char[]> buf;
};

struct OutFrame {
  Kind kind = Kind::kData;
  RequestPtr req;  // kData
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string text;  // kAbort
};

struct Peer {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  uint8_t txToken[kTokenBytes]{};
  uint8_t rxToken[kTokenBytes]{};
  std::deque<OutFrame> queue;  // not yet posted
  int inFlight = 0;
  uint64_t sentSeq = 0;  // last frameSeq posted
  uint64_t nextSeq = 1;  // next frameSeq to handle
  std::map<uint64_t, std::vector<char>> early;  // frames that completed before their turn
  bool closed = false;  // it closed in order: everything it sent has been handled
  bool closeSent = false;  // our close frame is queued or gone
};

class FabricTransport : public EngineTransport {
 public:
  explicit FabricTransport(const TransportOptions& o)
      : EngineTransport(o, {.name = "fabric", .drainBound = kDrainBound}),
        peers_(static_cast<size_t>(o.size)) {}

  ~FabricTransport() override {
    stopEngine();
    closeFabric();
  }

  Result<std::string> publish() override {
    const size_t cqSize = 4 * (kRecvBuffers + kSendWindow * static_cast<size_t>(o_.size));
    NANOCCL_CHECK(endpoint_.open(o_, cqSize));
    NANOCCL_CHECK(crypto::randomBytes(nonce_, sizeof(nonce_)));
    char name[256];
    size_t len = sizeof(name);
    if (const int rc = fi_getname(&ep()->fid, name, &len); rc != 0) {
      return unavailableError(fiError("fi_getname", rc));
    }
    return formatAddress(name, len, nonce_);
  }

  Status attach(const std::vector<std::string>& addresses, const Deadline&) override {
    const CommIdentity member(o_.secret, o_.commId);
    for (int p = 0; p < o_.size; ++p) {
      if (p == o_.rank) continue;
      std::vector<uint8_t> name, nonce;
      const std::string& a = addresses[p];
      if (!parseAddress(a, &name, &nonce)) {
        return invalidArgument(engine_.me() + "rank " + std::to_string(p) + " published '" +
                               a.substr(0, 40) +
                               "', not a fabric address (do all ranks use "
                               "NANOCCL_TRANSPORT=fabric?)");
      }
      fi_addr_t addr = FI_ADDR_UNSPEC;
      if (fi_av_insert(endpoint_.av(), name.data(), 1, &addr, 0, nullptr) != 1) {
        return unavailableError(engine_.me() + "fi_av_insert refused rank " + std::to_string(p) +
                                "'s address");
      }
      Peer& peer = peers_[p];
      peer.addr = addr;
      frameToken(member, o_.rank, p, nonce_, nonce.data(), peer.txToken);  // wire.h
      frameToken(member, p, o_.rank, nonce.data(), nonce_, peer.rxToken);
    }
    for (int i = 0; i < kRecvBuffers; ++i) {
      auto* c = new OpCtx();
      c->buf.reset(new char[recvBytes()]);
      recvs_.push_back(c);
      NANOCCL_CHECK(postRecv(c));
    }
    // Every rank greets every peer with a frame only a holder of the job secret can make, and
    // waits for theirs (started()): a rank with another secret (or none there) is named at
    // setup.
    hello_.assign(static_cast<size_t>(o_.size), false);
    badTokens_.assign(static_cast<size_t>(o_.size), 0);
    for (int p = 0; p < o_.size; ++p) {
      if (p != o_.rank) queueControl(p, Kind::kHello);
    }
    return Status::ok();
  }

  Status started(const Deadline& deadline) override {
    std::string missing, unproven;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto allGreeted = [&] {
        return std::count(hello_.begin(), hello_.end(), true) == o_.size - 1 ||
               !setupFailure_.isOk();
      };
      if (!waitUntil(cv_, lock, deadline, allGreeted)) {
        for (int p = 0; p < o_.size; ++p) {
          if (p == o_.rank || hello_[p]) continue;
          missing += std::string(missing.empty() ? "" : ", ") + std::to_string(p);
          if (badTokens_[p] == 0) continue;
          unproven += std::string(unproven.empty() ? "" : ", ") + std::to_string(p);
        }
      }
      if (!setupFailure_.isOk()) return setupFailure_;  // a greeting refused, or a peer's abort
    }
    if (missing.empty()) return Status::ok();
    return timeoutError(
        engine_.me() + "fabric setup timed out waiting for rank(s) " + missing + " to greet" +
        (unproven.empty() ? std::string(" (did every rank reach connect(), with the same "
                                        "FI_PROVIDER and FI_OFI_RXM_BUFFER_SIZE? ranks whose "
                                        "rxm settings differ cannot reach each other)")
                          : "; frames claiming to come from rank(s) " + unproven +
                                " did not prove this job's secret (do all ranks use the same "
                                "NANOCCL_SECRET_FILE or secret, and this communicator?)"));
  }

  std::string describe() const override {
    return "fabric/" + endpoint_.provider() +
           (endpoint_.domainName().empty() ? "" : " via " + endpoint_.domainName());
  }

 private:
  fid_ep* ep() const { return endpoint_.ep(); }
  fid_cq* cq() const { return endpoint_.cq(); }

  // The endpoint is closed before the buffers its operations target are freed.
  void closeFabric() {
    endpoint_.close();
    for (OpCtx* c : recvs_) delete c;
    recvs_.clear();
    for (OpCtx* c : sendsInFlight_) delete c;
    sendsInFlight_.clear();
  }

  // ---- the Mover (engine.h): with the engine's progress held ----------------------------

  bool progress() override { return handle(fi_cq_read(cq(), entries_, kEntries)); }

  bool wait(std::chrono::microseconds d) override {
    const auto cap = engine_.stopping() || engine_.hasPending() ? std::chrono::milliseconds(10)
                                                                 : std::chrono::milliseconds(100);
    const int ms = static_cast<int>(
        std::min(std::chrono::ceil<std::chrono::milliseconds>(d), cap).count());
    if (endpoint_.canWait()) return handle(fi_cq_sread(cq(), entries_, kEntries, nullptr, ms));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return handle(fi_cq_read(cq(), entries_, kEntries));
  }

  void wake() override {
    if (cq() != nullptr && endpoint_.canWait()) fi_cq_signal(cq());
  }

  // What fi_cq_read/sread returned: completions handled, then the queued frames posted, and
  // every kPingPeriod while requests are pending the peers pinged.
  bool handle(ssize_t n) {
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) onCompletion(entries_[i]);
    } else if (n == -FI_EAVAIL) {
      onError();
    } else if (n < 0 && n != -FI_EAGAIN && n != -FI_EINTR && n != -FI_ETIMEDOUT &&
               n != -FI_ECANCELED) {
      engine_.fail(internalError(engine_.me() + "fabric: " + fiError("fi_cq_read", n)), true);
    }
    // The clock first: the engine polls this in its spin, and hasPending() walks the queues.
    if (Clock::now() >= lastPing_ + kPingPeriod && engine_.failed().isOk() &&
        engine_.hasPending()) {
      // A dead peer fails the sends to it: ping those this rank waits on, sends to or not.
      for (int p = 0; p < o_.size; ++p) {
        if (p != o_.rank && !peers_[p].closed && peers_[p].queue.empty()) {
          queueControl(p, Kind::kPing);
        }
      }
      lastPing_ = Clock::now();
    }
    for (int p = 0; p < o_.size; ++p) {
      if (p != o_.rank) pump(p);
    }
    return n > 0 || n == -FI_EAVAIL;
  }

  void startSend(const RequestPtr& req) override {
    Peer& peer = peers_[req->peer];
    if (peer.closed) {
      engine_.fail(engine_.closedPeer(req->peer), true);
      return req->complete(engine_.failed(), -1);
    }
    const uint64_t frames = std::max<uint64_t>(1, (req->bytes + chunkBytes_ - 1) / chunkBytes_);
    req->framesLeft = frames;
    for (uint64_t i = 0; i < frames; ++i) {
      OutFrame f;
      f.kind = Kind::kData;
      f.req = req;
      f.offset = i * chunkBytes_;
      f.length = std::min<uint64_t>(chunkBytes_, req->bytes - f.offset);
      peer.queue.push_back(std::move(f));
    }
    pump(req->peer);
  }

  void onStop(Engine& engine, const Status& why, bool pending) override {
    stopBy_ = Clock::now() + kCloseBound;
    if (pending) return engine.fail(why, true);
    if (!engine.failed().isOk()) return;
    // Like closing a connection in order: the peers still get what was sent.
    for (int p = 0; p < o_.size; ++p) {
      if (p != o_.rank && !peers_[p].closed) sendClose(p);
    }
  }

  // Destroyed: done once the last frames (close, abort) have left and, closing in order, every
  // peer's close has come back (a peer answers ours with its own once it has handled all we
  // sent: a send the provider completed may still sit in its queues, which closing the
  // endpoint drops), or at the bound.
  bool stopped() const override {
    if (Clock::now() >= stopBy_) return true;
    if (!sendsInFlight_.empty() || !nothingQueued()) return false;
    if (!engine_.failed().isOk()) return true;
    for (int p = 0; p < o_.size; ++p) {
      if (p != o_.rank && !peers_[p].closed) return false;
    }
    return true;
  }

  void sendClose(int p) {
    peers_[p].closeSent = true;
    queueControl(p, Kind::kClose);
  }

  bool sendsPending() const override {
    for (const Peer& p : peers_) {
      for (const OutFrame& f : p.queue) {
        if (f.req) return true;
      }
    }
    for (const OpCtx* c : sendsInFlight_) {
      if (c->req) return true;
    }
    return false;
  }

  // The provider may still read a send's buffer while one of its frames is posted.
  bool busy(const BasicRequest* r) const override {
    if (r != nullptr) return r->isSend && static_cast<const EngineRequest*>(r)->framesInFlight > 0;
    for (const OpCtx* c : sendsInFlight_) {
      if (c->req) return true;
    }
    return false;
  }

  // The queued frames are dropped (a send the provider still reads from completes when its
  // last posted frame does), and the peers are told if asked.
  void onFail(const Status& why, bool notifyPeers, RequestList& out) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      setupFailure_ = why;  // connect() may be waiting for greetings
    }
    cv_.notify_all();
    for (int p = 0; p < o_.size; ++p) {
      Peer& peer = peers_[p];
      for (OutFrame& f : peer.queue) {
        if (f.req) out.push_back(f.req);
      }
      peer.queue.clear();
      if (notifyPeers && p != o_.rank && !peer.closed) {
        queueControl(p, Kind::kAbort, why.message().substr(0, kMaxAbortText));
      }
    }
  }

  // ---- frames ---------------------------------------------------------------------------

  void queueControl(int p, Kind kind, std::string text = {}) {
    OutFrame f;
    f.kind = kind;
    f.text = std::move(text);
    peers_[p].queue.push_back(std::move(f));
    pump(p);
  }

  // Posts the queued frames to `p` while its window has room.
  void pump(int p) {
    Peer& peer = peers_[p];
    while (!peer.queue.empty() && peer.inFlight < kSendWindow) {
      OutFrame& f = peer.queue.front();
      auto* c = new OpCtx();
      c->isSend = true;
      c->peer = p;
      c->req = f.req;
      WireHeader& h = c->hdr;
      std::memcpy(h.token, peer.txToken, kTokenBytes);
      h.from = static_cast<uint32_t>(o_.rank);
      h.kind = f.kind;
      h.frameSeq = peer.sentSeq + 1;
      const char* payload = nullptr;
      uint64_t length = 0;
      if (f.kind == Kind::kData) {
        const EngineRequest& r = *f.req;
        h.frame = dataFrameHeader(r.env.fingerprint, r.env.tag, r.wireSeq, r.bytes, f.offset,
                                  f.length);
        payload = r.buf + f.offset;
        length = f.length;
      } else if (f.kind == Kind::kHello) {
        h.frame.total = chunkBytes_;  // the largest payload this rank sends (and receives)
      } else if (f.kind == Kind::kAbort) {
        c->extra = f.text;  // a copy: an -FI_EAGAIN below leaves the frame queued
        h.frame = abortFrameHeader(c->extra.size());
        payload = c->extra.data();
        length = c->extra.size();
      }
      const ssize_t rc = endpoint_.send(peer.addr, &h, payload, length, &c->extra, &c->ctx);
      if (rc == -FI_EAGAIN) {  // the provider's queue is full: again after progress
        delete c;
        return;
      }
      if (rc != 0) {
        delete c;
        return engine_.fail(peerError(engine_.me() + "fabric: sending to rank " +
                                      std::to_string(p) + " failed: " +
                                      fi_strerror(static_cast<int>(-rc))),
                            true);
      }
      peer.sentSeq = h.frameSeq;
      ++peer.inFlight;
      if (c->req) ++c->req->framesInFlight;
      sendsInFlight_.push_back(c);
      peer.queue.pop_front();
    }
  }

  Status postRecv(OpCtx* c) {
    const ssize_t rc = endpoint_.postRecv(c->buf.get(), recvBytes(), &c->ctx);
    if (rc != 0) {
      return unavailableError(engine_.me() + "fabric: " + fiError("fi_trecv", rc));
    }
    return Status::ok();
  }

  void repost(OpCtx* c) {
    if (Status st = postRecv(c); !st.isOk()) engine_.fail(st, true);
  }

  void onCompletion(const fi_cq_tagged_entry& e) {
    auto* c = reinterpret_cast<OpCtx*>(e.op_context);
    if (c->isSend) return onSendDone(c, Status::ok());
    onFrame(c->buf.get(), e.len);
    repost(c);
  }

  void onError() {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(cq(), &err, 0) != 1) return;
    auto* c = reinterpret_cast<OpCtx*>(err.op_context);
    const std::string what = fi_cq_strerror(cq(), err.prov_errno, err.err_data, nullptr, 0);
    if (c == nullptr) return;
    if (c->isSend) {
      return onSendDone(c, peerError(engine_.me() + "fabric: sending to rank " +
                                     std::to_string(c->peer) + " failed (" +
                                     fi_strerror(err.err) + ": " + what +
                                     "; the rank died or is unreachable)"));
    }
    if (err.err == FI_ECANCELED) return;  // closing
    // A receive that went wrong (a stranger's oversized message, say) is dropped: nothing in
    // it is trusted, and a stranger must not be able to fail the job.
    dropped("a receive failed: " + std::string(fi_strerror(err.err)));
    repost(c);
  }

  void onSendDone(OpCtx* c, const Status& st) {
    sendsInFlight_.erase(std::find(sendsInFlight_.begin(), sendsInFlight_.end(), c));
    std::unique_ptr<OpCtx> done(c);
    --peers_[c->peer].inFlight;
    // A control frame to a peer that closed (our answer to its close, a ping) may find its
    // endpoint gone: nothing was lost.
    const bool lateControl = c->req == nullptr && peers_[c->peer].closed;
    if (!st.isOk() && !lateControl) engine_.fail(st, true);
    if (RequestPtr& r = c->req) {
      --r->framesInFlight;
      if (!engine_.failed().isOk()) return engine_.completeIfFree(r);
      engine_.frameSent(r);
    }
    engine_.updateDrained();
  }

  void dropped(const std::string& why) {
    if (++strangers_ == 1) {
      NANOCCL_WARN("rank " << o_.rank << ": fabric: dropped a message that did not prove the "
                              "job secret (" << why << "); later ones are dropped silently");
    }
  }

  // A frame arrived in a bounce buffer (`len` bytes). Checked before anything is used.
  void onFrame(const char* data, size_t len) {
    if (len < sizeof(WireHeader)) return dropped("too short");
    WireHeader h;
    std::memcpy(&h, data, sizeof(h));
    if (h.from >= static_cast<uint32_t>(o_.size) || h.from == static_cast<uint32_t>(o_.rank)) {
      return dropped("no such rank");
    }
    if (!crypto::equalConstantTime(h.token, peers_[h.from].rxToken, kTokenBytes)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++badTokens_[h.from];  // named if that rank never greets (connect)
      }
      return dropped("bad token");
    }
    if (!engine_.failed().isOk()) return;
    // From here on the sender is a rank of this job: what is wrong is a protocol error.
    const int p = static_cast<int>(h.from);
    Peer& peer = peers_[p];
    Status st = checkFrame(h, len, chunkBytes_);  // wire.h
    if (st.isOk() && h.frameSeq < peer.nextSeq) {
      st = protocolError("frame #" + std::to_string(h.frameSeq) + " repeated");
    }
    if (!st.isOk()) return engine_.failFrom(p, st);
    if (h.frameSeq > peer.nextSeq) {  // completed before an earlier one: wait for it
      peer.early[h.frameSeq].assign(data, data + len);
      return;
    }
    handleFrame(p, h, data + sizeof(h));
    ++peer.nextSeq;
    for (auto it = peer.early.begin(); it != peer.early.end() && it->first == peer.nextSeq &&
                                       engine_.failed().isOk();
         it = peer.early.erase(it)) {
      WireHeader e;
      std::memcpy(&e, it->second.data(), sizeof(e));
      handleFrame(p, e, it->second.data() + sizeof(e));
      ++peer.nextSeq;
    }
  }

  void handleFrame(int p, const WireHeader& h, const char* payload) {
    if (!engine_.failed().isOk()) return;
    switch (h.kind) {
      case Kind::kData: return engine_.land(p, 0, h.frame, payload);
      case Kind::kAbort: return engine_.peerFailed(p, std::string_view(payload, h.frame.length));
      case Kind::kClose: {
        peers_[p].closed = true;
        if (engine_.laneClosed(p, 0)) return;
        // Data still queued for it is lost; a queued ping no longer matters (a queued close of
        // ours still goes: it is the answer the peer waits for).
        std::deque<OutFrame>& queue = peers_[p].queue;
        if (std::any_of(queue.begin(), queue.end(), [](const OutFrame& f) { return f.req; })) {
          return engine_.fail(engine_.closedPeer(p), true);
        }
        std::erase_if(queue, [](const OutFrame& f) { return f.kind == Kind::kPing; });
        // Its answer: everything it sent has been handled here (stopped()).
        if (!peers_[p].closeSent) sendClose(p);
        return;
      }
      case Kind::kPing: return;
      case Kind::kHello: {
        if (h.frame.total > chunkBytes_) {  // its frames would not fit our bounce buffers
          return engine_.fail(
              invalidArgument(engine_.me() + "rank " + std::to_string(p) +
                              " sends fabric frames of up to " + std::to_string(h.frame.total) +
                              " bytes, this rank takes " + std::to_string(chunkBytes_) +
                              " (FI_OFI_RXM_BUFFER_SIZE differs between the ranks: set the "
                              "same value, or none, on every rank)"),
              true);
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          hello_[p] = true;
        }
        cv_.notify_all();
        return;
      }
    }
  }

  bool nothingQueued() const {
    for (const Peer& p : peers_) {
      if (!p.queue.empty()) return false;
    }
    return true;
  }

  static constexpr int kEntries = 16;

  const uint64_t chunkBytes_ = providerDefaults();  // payload per frame; set before any fi_ call
  size_t recvBytes() const { return sizeof(WireHeader) + chunkBytes_; }  // a bounce buffer
  Endpoint endpoint_;  // endpoint.h
  uint8_t nonce_[kNonceBytes]{};
  std::vector<Peer> peers_;

  std::mutex mu_;  // guards hello_, badTokens_, setupFailure_
  Status setupFailure_;  // the engine's failure, for connect()
  std::condition_variable cv_;
  std::vector<bool> hello_;           // the peers whose greeting proved the secret
  std::vector<uint64_t> badTokens_;   // frames per claimed sender that did not

  // Progress state (the engine's progress held).
  std::vector<OpCtx*> recvs_;          // the bounce buffers, always posted
  std::vector<OpCtx*> sendsInFlight_;  // posted sends the provider has not completed
  uint64_t strangers_ = 0;             // frames dropped for not proving the secret
  Clock::time_point lastPing_ = Clock::now();
  Clock::time_point stopBy_{};
  fi_cq_tagged_entry entries_[kEntries];
};

}  // namespace

Result<std::unique_ptr<Transport>> createFabricTransport(const TransportOptions& options) {
  if (options.config.encrypt) {
    return invalidArgument("NANOCCL_ENCRYPT=1: the fabric transport does not encrypt; use "
                           "NANOCCL_TRANSPORT=tcp for encrypted connections");
  }
  return std::unique_ptr<Transport>(std::make_unique<FabricTransport>(options));
}

}  // namespace nanoccl::fabric
