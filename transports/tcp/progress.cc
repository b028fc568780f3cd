// The TCP transport's Mover half (transports/engine.h), run with the engine's progress held:
// the IoEngine's completions; the send path (a message's frames striped over the connections,
// sealed into records where the job encrypts); the receive path (a header, then its payload or
// a peer's abort text, matched through the engine's Matcher); and failure (telling the peers
// on every idle connection, shutting the sockets down). The rest of TcpTransport is in
// tcp_transport.cc; the class and its connections in tcp_transport_impl.h.
#include "transports/tcp/tcp_transport_impl.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/logging.h"
#include "transports/frame.h"
#include "transports/matcher.h"
#include "transports/tcp/io_engine.h"
#include "transports/tcp/layout.h"

namespace nanoccl::tcp {

bool TcpTransport::pollEngine(int timeoutMs) {
  bool completed = false;
  const Status st = io_->poll(timeoutMs, [&](const IoCompletion& c) {
    completed = true;
    onCompletion(c);
  });
  if (!st.isOk()) engine_.fail(st.withContext(engine_.me()), true);
  return completed;
}

std::vector<Part> TcpTransport::layout(uint64_t seq, uint32_t tag, OpType op, uint64_t total,
                                       int lanes) const {
  int n = connections();
  if (lanes > 0) n = std::min(n, lanes * rails_);
  return layoutMessage(railLayout_, n, op, seq, tag, total);
}

void TcpTransport::startSend(const RequestPtr& req) {
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

void TcpTransport::kickSend(Conn& c) {
  if (c.sendInFlight || c.queue.empty() || !engine_.failed().isOk()) return;
  OutFrame& f = c.queue.front();
  const iovec iov[2] = {{&f.hdr, sizeof(f.hdr)},
                        {const_cast<char*>(f.payload), static_cast<size_t>(f.hdr.length)}};
  c.sendInFlight = true;
  if (Status st = io_->postSend(c.fd, iov, 2, &c.sendCookie); !st.isOk()) {
    c.sendInFlight = false;
    engine_.fail(st, true);
  }
}

void TcpTransport::postHeaderRecv(Conn& c) {
  if (!engine_.failed().isOk()) return;
  c.stage = Conn::Stage::kHeader;
  c.target.reset();
  postRecv(c, &c.hdr, sizeof(c.hdr));
}

void TcpTransport::postRecv(Conn& c, void* dest, uint64_t len) {
  c.recvInFlight = true;
  if (Status st = io_->postRecv(c.fd, dest, len, &c.recvCookie); !st.isOk()) {
    c.recvInFlight = false;
    engine_.fail(st, true);
  }
}

void TcpTransport::onCompletion(const IoCompletion& ev) {
  const Cookie& cookie = *static_cast<Cookie*>(ev.cookie);
  Conn& c = *cookie.conn;
  if (cookie.send) {
    onSendDone(c, ev.result);
  } else {
    onRecvDone(c, ev);
  }
  engine_.updateDrained();
}

void TcpTransport::onSendDone(Conn& c, int64_t result) {
  c.sendInFlight = false;
  OutFrame f = std::move(c.queue.front());
  c.queue.pop_front();
  if (!engine_.failed().isOk()) return engine_.completeIfFree(f.req);
  if (result < 0) return engine_.failSoon(connectionError(c, result), f.req);
  if (f.req) railSent_[c.index % rails_].fetch_add(f.hdr.length, std::memory_order_relaxed);
  if (f.req) engine_.frameSent(f.req);
  kickSend(c);
}

void TcpTransport::onRecvDone(Conn& c, const IoCompletion& ev) {
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

void TcpTransport::onHeader(Conn& c) {
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

void TcpTransport::onPayload(Conn& c, const IncomingPtr& msg) {
  railReceived_[c.index % rails_].fetch_add(c.hdr.length, std::memory_order_relaxed);
  engine_.matcher().landed(msg, c.hdr.length);
  postHeaderRecv(c);
}

Status TcpTransport::connectionError(const Conn& c, int64_t result) const {
  const std::string who = engine_.me() + "connection to rank " + std::to_string(c.peer);
  if (result == 0) {
    return peerError(who + " closed (rank " + std::to_string(c.peer) +
                     " exited, crashed or destroyed its communicator)");
  }
  return peerError(who + " failed: " + std::strerror(static_cast<int>(-result)));
}

bool TcpTransport::sendsPending() const {
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

void TcpTransport::onFail(const Status& why, bool notifyPeers, RequestList& out) {
  const std::string text = why.message().substr(0, kMaxAbortText);
  for (auto& row : peers_) {
    if (notifyPeers) {
      // Every idle connection to this peer carries the reason before it closes, so the peer
      // reads it whichever connection it hears from first.
      for (auto& c : row) {
        if (c->sendInFlight) continue;  // then its staging buffer is free, too
        FrameHeader h = abortFrameHeader(text.size());
        const iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(text.data()), text.size()}};
        io_->sendNow(c->fd, iov, 2);
      }
    }
    // Ends every in-flight operation on these sockets promptly.
    for (auto& c : row) shutdown(c->fd, SHUT_RDWR);
  }
  // The queued sends (the engine completes those whose buffers no socket operation targets;
  // the others complete when it ends: onSendDone).
  for (auto& row : peers_) {
    for (auto& c : row) {
      for (auto& f : c->queue) {
        if (f.req) out.push_back(f.req);
      }
    }
  }
}

bool TcpTransport::busy(const BasicRequest* r) const {
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

}  // namespace nanoccl::tcp
