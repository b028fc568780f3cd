// The TCP transport's progress thread (tcp_transport.h): its loop over the commands the calling
// threads post and the engine's completions; the send path (a message's frames striped over the
// connections, sealed into records where the job encrypts); the receive path (a header, then
// its payload or a peer's abort text, matched through the Matcher); and failure (the grace
// after a connection closes, fail(), telling the peers). The rest of TcpTransport is in
// tcp_transport.cc; the class, its connections and commands in tcp_transport_impl.h.
#include "transports/tcp/tcp_transport_impl.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "common/logging.h"
#include "common/spin.h"
#include "transports/frame.h"
#include "transports/matcher.h"
#include "transports/tcp/layout.h"
#include "transports/tcp/socket_ops.h"
#include "transports/transport_common.h"

namespace nanoccl::tcp {

void TcpTransport::progressLoop() {
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

std::vector<Part> TcpTransport::layout(uint64_t seq, uint32_t tag, OpType op, uint64_t total,
                                       int lanes) const {
  int n = connections();
  if (lanes > 0) n = std::min(n, lanes * rails_);
  return layoutMessage(railLayout_, n, op, seq, tag, total);
}

void TcpTransport::startSend(const RequestPtr& req) {
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

void TcpTransport::kickSend(Conn& c) {
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

Result<size_t> TcpTransport::sealNext(Conn& c, OutFrame& f) {
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

void TcpTransport::startRecv(const RequestPtr& req) {
  if (!failed_.isOk()) return req->complete(failed_, -1);
  const Status st = matcher_->postRecv(req);
  if (st.isOk()) return;
  // A connection it needs is closed: the peer's reason may still come on another.
  if (st.code() == StatusCode::kPeerError) return failOnClose(st, req);
  fail(st, true);
  req->complete(failed_, -1);  // held by no table: fail() cannot see it
}

void TcpTransport::postHeaderRecv(Conn& c) {
  if (!failed_.isOk()) return;
  c.stage = Conn::Stage::kHeader;
  c.target.reset();
  if (c.rx) return postRecv(c, c.rxStage.data(), kSealedHeaderBytes);
  postRecv(c, &c.hdr, sizeof(c.hdr));
}

void TcpTransport::postPayloadRecv(Conn& c, char* dest, uint64_t len) {
  if (!c.rx) return postRecv(c, dest, len);
  c.rxDest = dest;
  c.rxLeft = len;
  postNextRecord(c);
}

void TcpTransport::postNextRecord(Conn& c) {
  c.rxRecord = std::min(kRecordBytes, c.rxLeft);
  c.rxLeft -= c.rxRecord;
  postRecv(c, c.rxStage.data(), c.rxRecord + crypto::kTagBytes);
}

void TcpTransport::postRecv(Conn& c, void* dest, uint64_t len) {
  c.recvInFlight = true;
  if (Status st = engine_->postRecv(c.fd, dest, len, &c.recvCookie); !st.isOk()) {
    c.recvInFlight = false;
    fail(st, true);
  }
}

Status TcpTransport::openRecord(Conn& c) {
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

void TcpTransport::onCompletion(const IoCompletion& ev) {
  const Cookie& cookie = *static_cast<Cookie*>(ev.cookie);
  Conn& c = *cookie.conn;
  if (cookie.send) {
    onSendDone(c, ev.result);
  } else {
    onRecvDone(c, ev.result);
  }
  updateDrained();
}

void TcpTransport::onSendDone(Conn& c, int64_t result) {
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

void TcpTransport::onRecvDone(Conn& c, int64_t result) {
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

void TcpTransport::onAbortText(const Conn& c) {
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

void TcpTransport::onHeader(Conn& c) {
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

void TcpTransport::onPayload(Conn& c, const IncomingPtr& msg) {
  railReceived_[c.index % rails_].fetch_add(c.hdr.length, std::memory_order_relaxed);
  matcher_->landed(msg, c.hdr.length);
  postHeaderRecv(c);
}

void TcpTransport::onOrderlyClose(Conn& c) {
  c.closed = true;
  NANOCCL_INFO("rank " << o_.rank << ": rank " << c.peer << " closed connection " << c.index);
  counters_.closed(c.peer);
  if (auto req = matcher_->laneClosed(c.peer, c.index)) {
    failOnClose(matcher_->closedError(c.peer, *req));
  }
}

Status TcpTransport::connectionError(const Conn& c, int64_t result) const {
  const std::string who = "rank " + std::to_string(o_.rank) + ": connection to rank " +
                          std::to_string(c.peer);
  if (result == 0) {
    return peerError(who + " closed (rank " + std::to_string(c.peer) +
                     " exited, crashed or destroyed its communicator)");
  }
  return peerError(who + " failed: " + std::strerror(static_cast<int>(-result)));
}

bool TcpTransport::hasPending() const {
  if (matcher_->hasPending()) return true;
  for (const auto& row : peers_) {
    for (const auto& c : row) {
      if (!c->queue.empty()) return true;
    }
  }
  return false;
}

size_t TcpTransport::inFlight() const {
  size_t n = 0;
  for (const auto& row : peers_) {
    for (const auto& c : row) n += (c->recvInFlight ? 1 : 0) + (c->sendInFlight ? 1 : 0);
  }
  return n;
}

void TcpTransport::updateDrained() {
  if (failed_.isOk() || inFlight() > 0) return;
  drained_.set();
}

void TcpTransport::failOnClose(const Status& why, const std::shared_ptr<BasicRequest>& parked) {
  if (!failed_.isOk()) {
    if (parked && !busy(*parked)) parked->complete(failed_, -1);
    return;
  }
  if (parked) parked_.push_back(parked);
  if (!closing_) closing_ = Closing{why, Clock::now() + kCloseGrace};
}

void TcpTransport::fail(const Status& why, bool notifyPeers) {
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

bool TcpTransport::busy(const BasicRequest& r) const {
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

}  // namespace nanoccl::tcp
