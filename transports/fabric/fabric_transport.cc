#include "transports/fabric/fabric_transport.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "common/crypto.h"
#include "common/logging.h"
#include "transports/engine.h"
#include "transports/fabric/address.h"
#include "transports/fabric/endpoint.h"
#include "transports/fabric/libfabric.h"
#include "transports/fabric/wire.h"
#include "transports/identity.h"

namespace nanoccl::fabric {
namespace {

constexpr size_t kRecvBuffers = 64;  // bounce buffers kept posted
constexpr int kSendWindow = 64;   // frames in flight per peer
constexpr auto kPingPeriod = std::chrono::milliseconds(250);
// How long abort() waits for sends the provider still reads from callers' buffers, and a
// destroyed transport for its last frames (close, abort) to leave.
constexpr auto kDrainBound = std::chrono::seconds(10);
constexpr auto kCloseBound = std::chrono::seconds(2);

using RequestPtr = EngineRequestPtr;

// A frame to send (queued for a peer, then posted) or a receive's bounce buffer: what the
// provider holds while it runs; fi_context first (FI_CONTEXT mode).
struct OpCtx {
  fi_context ctx{};
  bool isSend() const { return buf == nullptr; }  // a receive owns a bounce buffer
  int peer = -1;
  // Send: the header (its token and frameSeq set when posted) and the payload (a caller's
  // bytes, or `text`: an abort's); `req` is null for control frames. `scratch` holds the whole
  // frame where the provider takes one iov only.
  WireHeader hdr{};
  const char* payload = nullptr;
  uint64_t length = 0;
  std::string text;
  std::string scratch;
  RequestPtr req;
  // Receive: a bounce buffer.
  std::unique_ptr<char[]> buf;
};
using FramePtr = std::unique_ptr<OpCtx>;

struct Peer {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  uint8_t txToken[kTokenBytes]{};
  uint8_t rxToken[kTokenBytes]{};
  std::deque<FramePtr> queue;  // not yet posted
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
        peers_(static_cast<size_t>(o.size)) {
    peers_[o.rank].closed = true;  // this rank's own entry: never sent to, never heard from
  }

  // The endpoint is closed before the buffers its operations target are freed.
  ~FabricTransport() override {
    stopEngine();
    endpoint_.close();
    for (OpCtx* c : recvs_) delete c;
    for (OpCtx* c : sendsInFlight_) delete c;
  }

  Result<std::string> publish() override {
    // The completion queue has room for every bounce buffer and every peer's window, 4 times.
    NANOCCL_CHECK(endpoint_.open(o_, 4 * (kRecvBuffers + kSendWindow * peers_.size())));
    NANOCCL_CHECK(crypto::randomBytes(nonce_, sizeof(nonce_)));
    char name[256];
    size_t len = sizeof(name);
    if (const int rc = fi_getname(&endpoint_.ep()->fid, name, &len); rc != 0) {
      return unavailableError(fiError("fi_getname", rc));
    }
    return formatAddress(name, len, nonce_);
  }

  // Every rank greets every peer with a frame only a holder of the job secret can make, and
  // waits for theirs (started()): a rank with another secret (or none there) is named at setup.
  // Here: the bounce buffers, and every peer's address and tokens.
  Status attach(const std::vector<std::string>& addresses, const Deadline&) override {
    while (recvs_.size() < kRecvBuffers) {  // a refused connect() may have posted some
      auto c = std::make_unique<OpCtx>();
      c->buf.reset(new char[recvBytes()]);
      NANOCCL_CHECK(postRecv(c.get()));
      recvs_.push_back(c.release());
    }
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
      Peer& peer = peers_[p];
      if (fi_av_insert(endpoint_.av(), name.data(), 1, &peer.addr, 0, nullptr) != 1) {
        return unavailableError(engine_.me() + "fi_av_insert refused rank " + std::to_string(p) +
                                "'s address");
      }
      frameToken(member, o_.rank, p, nonce_, nonce.data(), peer.txToken);  // wire.h
      frameToken(member, p, o_.rank, nonce.data(), nonce_, peer.rxToken);
    }
    return Status::ok();
  }

  // The greetings go out on the progress thread's first turn (a frame that fails to post fails
  // the engine, which must be running).
  Status started(const Deadline& deadline) override {
    engine_.run([this] {
      for (int p = 0; p < o_.size; ++p) {
        if (!peers_[p].closed) queueControl(p, Kind::kHello);
      }
    });
    return engine_.awaitPeers(deadline,
                              "did every rank reach connect(), with the same FI_PROVIDER and "
                              "FI_OFI_RXM_BUFFER_SIZE? ranks whose rxm settings differ cannot "
                              "reach each other");
  }

  std::string describe() const override {
    return "fabric/" + endpoint_.provider() +
           (endpoint_.domainName().empty() ? "" : " via " + endpoint_.domainName());
  }

 private:
  fid_cq* cq() const { return endpoint_.cq(); }

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
    if (endpoint_.canWait()) fi_cq_signal(cq());
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
        if (!peers_[p].closed && peers_[p].queue.empty()) queueControl(p, Kind::kPing);
      }
      lastPing_ = Clock::now();
    }
    for (int p = 0; p < o_.size; ++p) pump(p);
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
      FramePtr f = frame(req->peer, Kind::kData, req);
      const uint64_t offset = i * chunkBytes_;
      f->length = std::min<uint64_t>(chunkBytes_, req->bytes - offset);
      f->payload = req->buf + offset;
      f->hdr.frame = dataFrameHeader(req->env.fingerprint, req->env.tag, req->wireSeq,
                                     req->bytes, offset, f->length);
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
      if (!peers_[p].closed) sendClose(p);
    }
  }

  // Destroyed: done once the last frames (close, abort) have left and, closing in order, every
  // peer's close has come back (a peer answers ours with its own once it has handled all we
  // sent: a send the provider completed may still sit in its queues, which closing the
  // endpoint drops), or at the bound.
  bool stopped() const override {
    if (Clock::now() >= stopBy_) return true;
    const bool inOrder = engine_.failed().isOk();
    return sendsInFlight_.empty() && std::all_of(peers_.begin(), peers_.end(), [&](const Peer& p) {
             return p.queue.empty() && (p.closed || !inOrder);
           });
  }

  void sendClose(int p) {
    peers_[p].closeSent = true;
    queueControl(p, Kind::kClose);
  }

  bool sendsPending() const override {
    for (const Peer& p : peers_) {
      for (const FramePtr& f : p.queue) {
        if (f->req) return true;
      }
    }
    return busy(nullptr);
  }

  // The provider may still read a send's buffer while one of its frames is posted.
  bool busy(const BasicRequest* r) const override {
    if (r != nullptr) return r->isSend && static_cast<const EngineRequest*>(r)->framesInFlight > 0;
    return std::any_of(sendsInFlight_.begin(), sendsInFlight_.end(),
                       [](const OpCtx* c) { return c->req != nullptr; });
  }

  // The queued frames are dropped (a send the provider still reads from completes when its
  // last posted frame does), and the peers are told if asked.
  void onFail(const Status& why, bool notifyPeers, RequestList& out) override {
    for (int p = 0; p < o_.size; ++p) {
      Peer& peer = peers_[p];
      for (const FramePtr& f : peer.queue) {
        if (f->req) out.push_back(f->req);
      }
      peer.queue.clear();
      if (notifyPeers && !peer.closed) {
        queueControl(p, Kind::kAbort, why.message().substr(0, kMaxAbortText));
      }
    }
  }

  // ---- frames ---------------------------------------------------------------------------

  FramePtr frame(int p, Kind kind, const RequestPtr& req = nullptr) {
    auto f = std::make_unique<OpCtx>();
    f->peer = p;
    f->req = req;
    f->hdr.from = static_cast<uint32_t>(o_.rank);
    f->hdr.kind = kind;
    return f;
  }

  void queueControl(int p, Kind kind, std::string text = {}) {
    FramePtr f = frame(p, kind);
    if (kind == Kind::kHello) f->hdr.frame.total = chunkBytes_;  // the largest payload here
    if (kind == Kind::kAbort) {
      f->text = std::move(text);
      f->hdr.frame = abortFrameHeader(f->text.size());
      f->payload = f->text.data();
      f->length = f->text.size();
    }
    peers_[p].queue.push_back(std::move(f));
    pump(p);
  }

  // Posts the queued frames to `p` while its window has room.
  void pump(int p) {
    Peer& peer = peers_[p];
    while (!peer.queue.empty() && peer.inFlight < kSendWindow) {
      OpCtx& f = *peer.queue.front();
      std::memcpy(f.hdr.token, peer.txToken, kTokenBytes);
      f.hdr.frameSeq = peer.sentSeq + 1;
      const ssize_t rc = endpoint_.send(peer.addr, &f.hdr, f.payload, f.length, &f.scratch,
                                        &f.ctx);
      if (rc == -FI_EAGAIN) return;  // the provider's queue is full: again after progress
      if (rc != 0) {
        return engine_.fail(peerError(engine_.me() + "fabric: sending to rank " +
                                      std::to_string(p) + " failed: " +
                                      libfabric().strerror(static_cast<int>(-rc))),
                            true);
      }
      peer.sentSeq = f.hdr.frameSeq;
      ++peer.inFlight;
      if (f.req) ++f.req->framesInFlight;
      sendsInFlight_.push_back(peer.queue.front().release());
      peer.queue.pop_front();
    }
  }

  Status postRecv(OpCtx* c) {
    const ssize_t rc = endpoint_.postRecv(c->buf.get(), recvBytes(), &c->ctx);
    return rc == 0 ? Status::ok()
                   : unavailableError(engine_.me() + "fabric: " + fiError("fi_trecv", rc));
  }

  void repost(OpCtx* c) {
    if (Status st = postRecv(c); !st.isOk()) engine_.fail(st, true);
  }

  void onCompletion(const fi_cq_tagged_entry& e) {
    auto* c = reinterpret_cast<OpCtx*>(e.op_context);
    if (c->isSend()) return onSendDone(c, Status::ok());
    onFrame(c->buf.get(), e.len);
    repost(c);
  }

  void onError() {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(cq(), &err, 0) != 1) return;
    auto* c = reinterpret_cast<OpCtx*>(err.op_context);
    const std::string what = fi_cq_strerror(cq(), err.prov_errno, err.err_data, nullptr, 0);
    if (c == nullptr) return;
    if (c->isSend()) {
      return onSendDone(c, peerError(engine_.me() + "fabric: sending to rank " +
                                     std::to_string(c->peer) + " failed (" +
                                     libfabric().strerror(err.err) + ": " + what +
                                     "; the rank died or is unreachable)"));
    }
    if (err.err == FI_ECANCELED) return;  // closing
    // A receive that went wrong (a stranger's oversized message, say) is dropped: nothing in
    // it is trusted, and a stranger must not be able to fail the job.
    dropped("a receive failed: " + std::string(libfabric().strerror(err.err)));
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
    if (++strangers_ > 1) return;
    NANOCCL_WARN(engine_.me() << "fabric: dropped a message that did not prove the job secret ("
                              << why << "); later ones are dropped silently");
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
      engine_.unproven(static_cast<int>(h.from));  // named if that rank never greets
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
    handleFrame(p, data);
    for (auto it = peer.early.begin(); it != peer.early.end() && it->first == peer.nextSeq;
         it = peer.early.erase(it)) {
      handleFrame(p, it->second.data());
    }
  }

  // The next frame from `p` in its order (checked: onFrame).
  void handleFrame(int p, const char* data) {
    ++peers_[p].nextSeq;
    if (!engine_.failed().isOk()) return;
    WireHeader h;
    std::memcpy(&h, data, sizeof(h));
    const char* payload = data + sizeof(h);
    switch (h.kind) {
      case Kind::kData: return engine_.land(p, 0, h.frame, payload);
      case Kind::kAbort: return engine_.peerFailed(p, std::string_view(payload, h.frame.length));
      case Kind::kClose: {
        peers_[p].closed = true;
        if (engine_.laneClosed(p, 0)) return;
        // Data still queued for it is lost; a queued ping no longer matters (a queued close of
        // ours still goes: it is the answer the peer waits for).
        std::deque<FramePtr>& queue = peers_[p].queue;
        if (std::any_of(queue.begin(), queue.end(), [](const FramePtr& f) { return f->req; })) {
          return engine_.fail(engine_.closedPeer(p), true);
        }
        std::erase_if(queue, [](const FramePtr& f) { return f->hdr.kind == Kind::kPing; });
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
        return engine_.proven(p);
      }
    }
  }

  static constexpr int kEntries = 16;

  const uint64_t chunkBytes_ = providerDefaults();  // payload per frame; set before any fi_ call
  size_t recvBytes() const { return sizeof(WireHeader) + chunkBytes_; }  // a bounce buffer
  Endpoint endpoint_;  // endpoint.h
  uint8_t nonce_[kNonceBytes]{};
  std::vector<Peer> peers_;


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
