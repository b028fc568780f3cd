#include "transports/fabric/fabric_transport.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <atomic>
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
#include "common/spin.h"
#include "common/thread_name.h"
#include "transports/fabric/address.h"
#include "transports/fabric/endpoint.h"
#include "transports/fabric/wire.h"
#include "transports/identity.h"
#include "transports/matcher.h"
#include "transports/transport_common.h"
#include "transports/request.h"

namespace nanoccl::fabric {
namespace {

constexpr int kRecvBuffers = 64;  // bounce buffers kept posted
constexpr int kSendWindow = 64;   // frames in flight per peer
constexpr auto kPingPeriod = std::chrono::milliseconds(250);
// How long abort() waits for sends the provider still reads from callers' buffers, and a
// destroyed transport for its last frames (close, abort) to leave.
constexpr auto kDrainBound = std::chrono::seconds(10);
constexpr auto kCloseBound = std::chrono::seconds(2);

class FabricRequest : public BasicRequest {
 public:
  using BasicRequest::BasicRequest;
  // Progress-thread state of a send.
  size_t framesLeft = 0;      // not yet completed by the provider
  size_t framesInFlight = 0;  // posted: the provider may still read the buffer
  uint64_t wireSeq = 0;       // the frames' seq (Matcher::wireSeq)
};
using RequestPtr = std::shared_ptr<FabricRequest>;

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
};

enum class CommandKind { kSend, kRecv, kAbort, kStop };
struct Command {
  CommandKind kind;
  RequestPtr req;
  Status why;
};

class FabricTransport : public Transport {
 public:
  explicit FabricTransport(const TransportOptions& o)
      : o_(o), peers_(static_cast<size_t>(o.size)), counters_(o.size),
        matcher_(matcherOptions()) {}

  ~FabricTransport() override {
    if (thread_.joinable()) {
      post({CommandKind::kStop, nullptr,
            abortedError("rank " + std::to_string(o_.rank) + ": communicator destroyed")});
      thread_.join();
    }
    closeFabric();
  }

  Result<std::string> listen() override {
    if (o_.size == 1) return std::string();
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

  Status connect(const std::vector<std::string>& addresses, const Deadline& deadline) override {
    const std::string me = "rank " + std::to_string(o_.rank) + ": ";
    if (thread_.joinable() || connected_.load()) {
      return invalidArgument(me + "connect() called twice");
    }
    if (o_.size == 1) {  // nobody to reach: no endpoint, no progress thread
      connected_.store(true, std::memory_order_release);
      return Status::ok();
    }
    {
      if (ep() == nullptr) return invalidArgument(me + "connect() before listen()");
      if (addresses.size() != static_cast<size_t>(o_.size)) {
        return invalidArgument("rank " + std::to_string(o_.rank) + ": " +
                               std::to_string(addresses.size()) + " addresses for " +
                               std::to_string(o_.size) + " ranks");
      }
      const CommIdentity member(o_.secret, o_.commId);
      for (int p = 0; p < o_.size; ++p) {
        if (p == o_.rank) continue;
        std::vector<uint8_t> name, nonce;
        const std::string& a = addresses[p];
        if (!parseAddress(a, &name, &nonce)) {
          return invalidArgument("rank " + std::to_string(o_.rank) + ": rank " +
                                 std::to_string(p) + " published '" + a.substr(0, 40) +
                                 "', not a fabric address (do all ranks use "
                                 "NANOCCL_TRANSPORT=fabric?)");
        }
        fi_addr_t addr = FI_ADDR_UNSPEC;
        if (fi_av_insert(endpoint_.av(), name.data(), 1, &addr, 0, nullptr) != 1) {
          return unavailableError("rank " + std::to_string(o_.rank) +
                                  ": fi_av_insert refused rank " + std::to_string(p) +
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
    }
    // Every rank greets every peer with a frame only a holder of the job secret can make, and
    // waits for theirs: a rank with another secret (or none there) is named here, at setup.
    hello_.assign(static_cast<size_t>(o_.size), false);
    badTokens_.assign(static_cast<size_t>(o_.size), 0);
    for (int p = 0; p < o_.size; ++p) {
      if (p != o_.rank) queueControl(p, Kind::kHello);
    }
    thread_ = namedThread("fabric", [this] { progressLoop(); });
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
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!setupFailure_.isOk()) return setupFailure_;  // a greeting refused, or a peer's abort
    }
    if (!missing.empty()) {
      return timeoutError(
          "rank " + std::to_string(o_.rank) + ": fabric setup timed out waiting for rank(s) " +
          missing + " to greet" +
          (unproven.empty() ? std::string(" (did every rank reach connect(), with the same "
                                          "FI_PROVIDER and FI_OFI_RXM_BUFFER_SIZE? ranks whose "
                                          "rxm settings differ cannot reach each other)")
                            : "; frames claiming to come from rank(s) " + unproven +
                                  " did not prove this job's secret (do all ranks use the same "
                                  "NANOCCL_SECRET_FILE or secret, and this communicator?)"));
    }
    NANOCCL_INFO("rank " << o_.rank << ": " << describe() << " connected to " << o_.size - 1
                         << " peers");
    connected_.store(true, std::memory_order_release);
    return Status::ok();
  }

  std::shared_ptr<Request> isend(int peer, const Envelope& env, const void* buf,
                                 size_t bytes) override {
    auto req = std::make_shared<FabricRequest>(
        true, peer, env, const_cast<char*>(static_cast<const char*>(buf)), bytes, spin_);
    return startRequest(std::move(req), o_.rank, o_.size,
                        connected_.load(std::memory_order_acquire),
                        [&](const auto& r) { post({CommandKind::kSend, r, {}}); });
  }

  std::shared_ptr<Request> irecv(int peer, const Envelope& env, void* buf,
                                 size_t bytes) override {
    auto req = std::make_shared<FabricRequest>(false, peer, env, static_cast<char*>(buf),
                                               bytes, spin_);
    return startRequest(std::move(req), o_.rank, o_.size,
                        connected_.load(std::memory_order_acquire),
                        [&](const auto& r) { post({CommandKind::kRecv, r, {}}); });
  }

  void abort(const Status& why) override {
    if (!thread_.joinable()) return;
    if (std::this_thread::get_id() == thread_.get_id()) {  // from a completion callback
      fail(why, true);
      return;
    }
    post({CommandKind::kAbort, nullptr, why});
    if (!drained_.waitFor(kDrainBound)) {
      NANOCCL_WARN("rank " << o_.rank << ": fabric: abort waited "
                           << std::chrono::duration_cast<std::chrono::seconds>(kDrainBound).count()
                           << " s and the provider still holds sends from callers' buffers; "
                              "they complete (and release them) when it lets go");
    }
  }

  std::vector<PeerCounters> counters() const override { return counters_.snapshot(); }

  std::string describe() const override {
    return "fabric/" + endpoint_.provider() +
           (endpoint_.domainName().empty() ? "" : " via " + endpoint_.domainName());
  }

 private:
  MatcherOptions matcherOptions() {
    MatcherOptions mo = matcherOptionsFor(o_, &counters_);
    mo.lanes = 1;  // a peer's frames are handled in its sending order
    mo.parts = [](OpType, uint64_t, uint32_t, uint64_t total, int) {
      return std::vector<Part>{{0, 0, total}};
    };
    mo.landsInOrder = true;
    return mo;
  }

  // ---- setup ----------------------------------------------------------------------------

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

  void post(Command cmd) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands_.push_back(std::move(cmd));
      commandsWaiting_.store(true, std::memory_order_release);
    }
    if (cq() != nullptr && endpoint_.canWait()) fi_cq_signal(cq());
  }

  // ---- progress thread ----------------------------------------------------------------

  void progressLoop() {
    bool stopping = false;
    Clock::time_point stopBy{};
    Clock::time_point lastBusy{};
    Clock::time_point lastPing = Clock::now();
    fi_cq_tagged_entry entries[16];
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
          case CommandKind::kStop:
            stopping = true;
            stopBy = Clock::now() + kCloseBound;
            if (hasPending()) {
              fail(cmd.why, true);
            } else if (failed_.isOk()) {
              // Like closing a connection in order: the peers still get what was sent.
              for (int p = 0; p < o_.size; ++p) {
                if (p != o_.rank && !peers_[p].closed) queueControl(p, Kind::kClose);
              }
            }
            break;
        }
      }
      if (!cmds.empty()) lastBusy = Clock::now();
      updateDrained();
      // Destroyed: done once the last frames (close, abort) have left, or at the bound.
      if (stopping && ((sendsInFlight_.empty() && nothingQueued()) || Clock::now() >= stopBy)) {
        return;
      }
      if (failed_.isOk() && hasPending() && Clock::now() >= lastPing + kPingPeriod) {
        // A dead peer fails the sends to it: ping those this rank waits on, sends to or not.
        for (int p = 0; p < o_.size; ++p) {
          if (p != o_.rank && !peers_[p].closed && peers_[p].queue.empty()) {
            queueControl(p, Kind::kPing);
          }
        }
        lastPing = Clock::now();
      }

      ssize_t n = fi_cq_read(cq(), entries, 16);
      const Clock::time_point waitStart = Clock::now();
      // A call in flight spins if its recent completions came within the budget (SpinPolicy).
      const bool inFlight = n == -FI_EAGAIN && hasPending();
      const std::chrono::microseconds spin =
          inFlight ? SpinPolicy::budget(spin_) : waitStart < lastBusy + spin_ ? spin_ : kNoSpin;
      if (n == -FI_EAGAIN && spin.count() > 0 && failed_.isOk()) {
        spinFor(spin, [&] {
          n = fi_cq_read(cq(), entries, 16);
          return n != -FI_EAGAIN || commandsWaiting_.load(std::memory_order_acquire);
        });
      }
      if (n == -FI_EAGAIN && !commandsWaiting_.load(std::memory_order_acquire)) {
        const int waitMs = stopping || hasPending() ? 10 : 100;
        if (endpoint_.canWait()) {
          n = fi_cq_sread(cq(), entries, 16, nullptr, waitMs);
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      if (inFlight) SpinPolicy::record(spin_, Clock::now() - waitStart);
      if (n > 0) {
        lastBusy = Clock::now();
        for (ssize_t i = 0; i < n; ++i) onCompletion(entries[i]);
      } else if (n == -FI_EAVAIL) {
        onError();
      } else if (n < 0 && n != -FI_EAGAIN && n != -FI_EINTR && n != -FI_ETIMEDOUT &&
                 n != -FI_ECANCELED) {
        fail(internalError("rank " + std::to_string(o_.rank) + ": fabric: " +
                           fiError("fi_cq_read", n)),
             true);
      }
      for (int p = 0; p < o_.size; ++p) {
        if (p != o_.rank) pump(p);
      }
    }
  }

  void startSend(const RequestPtr& req) {
    if (!failed_.isOk()) return req->complete(failed_, -1);
    Peer& peer = peers_[req->peer];
    if (peer.closed) {
      fail(closedPeer(req->peer), true);
      return req->complete(failed_, -1);
    }
    const uint64_t frames = std::max<uint64_t>(1, (req->bytes + chunkBytes_ - 1) / chunkBytes_);
    req->framesLeft = frames;
    req->wireSeq = matcher_.wireSeq(*req);
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

  void startRecv(const RequestPtr& req) {
    if (!failed_.isOk()) return req->complete(failed_, -1);
    if (Status st = matcher_.postRecv(req); !st.isOk()) {
      fail(st, true);
      req->complete(failed_, -1);  // held by no table: fail() cannot see it
    }
  }

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
        const FabricRequest& r = *f.req;
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
        return fail(peerError("rank " + std::to_string(o_.rank) + ": fabric: sending to rank " +
                              std::to_string(p) + " failed: " + fi_strerror(static_cast<int>(-rc))),
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
      return unavailableError("rank " + std::to_string(o_.rank) + ": fabric: " +
                              fiError("fi_trecv", rc));
    }
    return Status::ok();
  }

  void onCompletion(const fi_cq_tagged_entry& e) {
    auto* c = reinterpret_cast<OpCtx*>(e.op_context);
    if (c->isSend) return onSendDone(c, Status::ok());
    onFrame(c->buf.get(), e.len);
    if (Status st = postRecv(c); !st.isOk() && failed_.isOk()) fail(st, true);
  }

  void onError() {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(cq(), &err, 0) != 1) return;
    auto* c = reinterpret_cast<OpCtx*>(err.op_context);
    const std::string what = fi_cq_strerror(cq(), err.prov_errno, err.err_data, nullptr, 0);
    if (c == nullptr) return;
    if (c->isSend) {
      return onSendDone(c, peerError("rank " + std::to_string(o_.rank) +
                                     ": fabric: sending to rank " + std::to_string(c->peer) +
                                     " failed (" + fi_strerror(err.err) + ": " + what +
                                     "; the rank died or is unreachable)"));
    }
    if (err.err == FI_ECANCELED) return;  // closing
    // A receive that went wrong (a stranger's oversized message, say) is dropped: nothing in
    // it is trusted, and a stranger must not be able to fail the job.
    dropped("a receive failed: " + std::string(fi_strerror(err.err)));
    if (Status st = postRecv(c); !st.isOk() && failed_.isOk()) fail(st, true);
  }

  void onSendDone(OpCtx* c, const Status& st) {
    sendsInFlight_.erase(std::find(sendsInFlight_.begin(), sendsInFlight_.end(), c));
    std::unique_ptr<OpCtx> done(c);
    --peers_[c->peer].inFlight;
    if (!st.isOk() && failed_.isOk()) fail(st, true);
    if (RequestPtr& r = c->req) {
      --r->framesInFlight;
      if (!failed_.isOk()) {
        if (r->framesInFlight == 0) r->complete(failed_, -1);
      } else if (--r->framesLeft == 0) {
        counters_.sent(c->peer, r->bytes);
        r->complete(Status::ok(), o_.rank);
      }
    }
    updateDrained();
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
    if (!failed_.isOk()) return;
    // From here on the sender is a rank of this job: what is wrong is a protocol error.
    const int p = static_cast<int>(h.from);
    Peer& peer = peers_[p];
    const std::string from =
        "rank " + std::to_string(o_.rank) + ": from rank " + std::to_string(p) + ": ";
    Status st = checkFrame(h, len, chunkBytes_);  // wire.h
    if (st.isOk() && h.frameSeq < peer.nextSeq) {
      st = protocolError("frame #" + std::to_string(h.frameSeq) + " repeated");
    }
    if (!st.isOk()) return fail(st.withContext(from), true);
    if (h.frameSeq > peer.nextSeq) {  // completed before an earlier one: wait for it
      peer.early[h.frameSeq].assign(data, data + len);
      return;
    }
    handle(p, h, data + sizeof(h));
    ++peer.nextSeq;
    for (auto it = peer.early.begin(); it != peer.early.end() && it->first == peer.nextSeq &&
                                       failed_.isOk();
         it = peer.early.erase(it)) {
      WireHeader e;
      std::memcpy(&e, it->second.data(), sizeof(e));
      handle(p, e, it->second.data() + sizeof(e));
      ++peer.nextSeq;
    }
  }

  void handle(int p, const WireHeader& h, const char* payload) {
    if (!failed_.isOk()) return;
    switch (h.kind) {
      case Kind::kData: {
        Result<Matcher::IncomingPtr> msg = matcher_.onFrame(p, 0, h.frame);
        if (!msg.isOk()) return fail(msg.status(), true);
        if (h.frame.length > 0) {
          std::memcpy(msg.value()->dest(h.frame.offset), payload, h.frame.length);
        }
        matcher_.landed(msg.value(), h.frame.length);
        return;
      }
      case Kind::kAbort:
        return fail(peerError("rank " + std::to_string(o_.rank) + ": rank " + std::to_string(p) +
                              " failed: " + std::string(payload, h.frame.length)),
                    true);
      case Kind::kClose: {
        peers_[p].closed = true;
        NANOCCL_INFO("rank " << o_.rank << ": rank " << p << " closed its fabric transport");
        counters_.closed(p);
        if (auto req = matcher_.laneClosed(p, 0)) return fail(matcher_.closedError(p, *req), true);
        if (!peers_[p].queue.empty()) return fail(closedPeer(p), true);
        return;
      }
      case Kind::kPing: return;
      case Kind::kHello: {
        if (h.frame.total > chunkBytes_) {  // its frames would not fit our bounce buffers
          return fail(invalidArgument(
                          "rank " + std::to_string(o_.rank) + ": rank " + std::to_string(p) +
                          " sends fabric frames of up to " + std::to_string(h.frame.total) +
                          " bytes, this rank takes " + std::to_string(chunkBytes_) +
                          " (FI_OFI_RXM_BUFFER_SIZE differs between the ranks: set the same "
                          "value, or none, on every rank)"),
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

  Status closedPeer(int p) const {
    return peerError("rank " + std::to_string(o_.rank) + ": rank " + std::to_string(p) +
                     " closed its fabric transport (it exited, crashed or destroyed its "
                     "communicator) while rank " + std::to_string(o_.rank) +
                     " still had messages for it");
  }

  bool nothingQueued() const {
    for (const Peer& p : peers_) {
      if (!p.queue.empty()) return false;
    }
    return true;
  }

  bool hasPending() const {
    if (matcher_.hasPending()) return true;
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

  void updateDrained() {
    if (failed_.isOk()) return;
    for (const OpCtx* c : sendsInFlight_) {
      if (c->req) return;  // the provider may still read a caller's buffer
    }
    drained_.set();
  }

  // Fails the transport: every request completes with `why` (a send the provider still reads
  // from when its last posted frame completes), and the peers are told if asked.
  void fail(const Status& why, bool notifyPeers) {
    if (!failed_.isOk()) return;
    failed_ = why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      setupFailure_ = why;  // connect() may be waiting for greetings
    }
    cv_.notify_all();
    logTransportFailure(o_.rank, why, hasPending());
    std::vector<std::shared_ptr<BasicRequest>> pending = matcher_.takeAll();
    for (int p = 0; p < o_.size; ++p) {
      Peer& peer = peers_[p];
      for (OutFrame& f : peer.queue) {
        if (f.req && f.req->framesInFlight == 0) pending.push_back(f.req);
      }
      peer.queue.clear();
      if (notifyPeers && p != o_.rank && !peer.closed) {
        queueControl(p, Kind::kAbort, why.message().substr(0, kMaxAbortText));
      }
    }
    std::sort(pending.begin(), pending.end());
    pending.erase(std::unique(pending.begin(), pending.end()), pending.end());
    for (auto& r : pending) r->complete(why, -1);
    updateDrained();
  }

  const TransportOptions o_;
  const std::chrono::microseconds spin_{o_.config.spinUs};  // NANOCCL_SPIN_US
  const uint64_t chunkBytes_ = providerDefaults();  // payload per frame; set before any fi_ call
  size_t recvBytes() const { return sizeof(WireHeader) + chunkBytes_; }  // a bounce buffer
  Endpoint endpoint_;  // endpoint.h
  uint8_t nonce_[kNonceBytes]{};
  std::vector<Peer> peers_;
  std::thread thread_;
  std::atomic<bool> connected_{false};

  std::mutex mu_;  // guards commands_, hello_, badTokens_, setupFailure_
  Status setupFailure_;  // failed_, for connect()
  std::condition_variable cv_;
  std::vector<bool> hello_;           // the peers whose greeting proved the secret
  std::vector<uint64_t> badTokens_;   // frames per claimed sender that did not
  std::deque<Command> commands_;
  std::atomic<bool> commandsWaiting_{false};
  DrainedFlag drained_;  // abort() waits for it

  TransportCounters counters_;

  // Progress-thread state.
  Status failed_;
  Matcher matcher_;
  std::vector<OpCtx*> recvs_;          // the bounce buffers, always posted
  std::vector<OpCtx*> sendsInFlight_;  // posted sends the provider has not completed
  uint64_t strangers_ = 0;             // frames dropped for not proving the secret
};

}  // namespace

Result<std::unique_ptr<Transport>> createFabricTransport(const TransportOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return invalidArgument("fabric transport: rank " + std::to_string(options.rank) +
                           " outside a communicator of size " + std::to_string(options.size));
  }
  if (options.config.encrypt) {
    return invalidArgument("NANOCCL_ENCRYPT=1: the fabric transport does not encrypt; use "
                           "NANOCCL_TRANSPORT=tcp for encrypted connections");
  }
  return std::unique_ptr<Transport>(std::make_unique<FabricTransport>(options));
}

}  // namespace nanoccl::fabric
