#include "transports/matcher.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "common/logging.h"

namespace nanoccl {

Matcher::Matcher(MatcherOptions options)
    : o_(std::move(options)),
      lanes_(static_cast<size_t>(o_.size * o_.lanes)),
      p2pSent_(static_cast<size_t>(o_.size), 0) {}

uint64_t Matcher::wireSeq(const BasicRequest& send) {
  const OpFingerprint& fp = send.env.fingerprint;
  if (fp.op != OpType::kSendRecv) return fp.seq;
  return ++p2pSent_[static_cast<size_t>(send.peer)];
}

std::vector<Part> Matcher::partsOf(const FrameHeader& h) const {
  return o_.parts(h.op, h.seq, h.tag, h.total, h.lanes);
}

std::vector<Part> Matcher::partsOf(const BasicRequest& recv) const {
  const OpFingerprint& fp = recv.env.fingerprint;
  // A point-to-point receive does not know the sender's message number; its lanes do not
  // depend on it.
  return o_.parts(fp.op, fp.op == OpType::kSendRecv ? 0 : fp.seq, recv.env.tag, recv.bytes,
                  fp.lanes);
}

Status Matcher::matchCheck(const BasicRequest& req, const FrameHeader& h, int from) const {
  return checkMessageMatch(o_.rank, req, h, from);
}

Status Matcher::skipped(const BasicRequest& req, uint64_t theirSeq) const {
  return skippedCallError(o_.rank, req, theirSeq);
}

Status Matcher::closedError(int peer, const BasicRequest& req) const {
  const std::string who = peer == kAnySource ? "every peer" : "rank " + std::to_string(peer);
  return peerError("rank " + std::to_string(o_.rank) + ": " + who +
                   " closed its end of the transport while rank " + std::to_string(o_.rank) +
                   " still waits for its part of " + req.env.fingerprint.describe() + " (" + who +
                   " exited, crashed or destroyed its communicator)");
}

// ---- receives -------------------------------------------------------------------------------

Status Matcher::postRecv(const RequestPtr& req) {
  const OpFingerprint& fp = req->env.fingerprint;
  if (fp.op == OpType::kSendRecv) {
    for (auto it = unexpectedP2P_.begin(); it != unexpectedP2P_.end(); ++it) {
      const Incoming& m = **it;
      if (m.first.tag != req->env.tag || (req->peer != kAnySource && req->peer != m.peer)) {
        continue;
      }
      NANOCCL_CHECK(matchCheck(*req, m.first, m.peer));
      IncomingPtr msg = *it;
      unexpectedP2P_.erase(it);
      if (!msg->complete()) arrivingP2P_.push_back(msg);
      attach(msg, req);
      return Status::ok();
    }
    if (p2pUnreachable(*req)) return closedError(req->peer, *req);
    postedP2P_.push_back(req);
    return Status::ok();
  }

  const Key key{req->peer, fp.seq, req->env.tag};
  if (auto it = inflight_.find(key); it != inflight_.end() && !it->second->req) {
    IncomingPtr msg = it->second;
    NANOCCL_CHECK(matchCheck(*req, msg->first, req->peer));
    attach(msg, req);
    return Status::ok();
  }
  if (posted_.count(key) != 0 || inflight_.count(key) != 0) {
    return internalError("rank " + std::to_string(o_.rank) +
                         ": two receives posted for one message of " + fp.describe());
  }
  // Every message of one call carries the same fingerprint, whatever its tag: a message of
  // this call from this peer that disagrees means the ranks run different calls.
  for (auto it = inflight_.lower_bound(Key{key.peer, key.seq, 0});
       it != inflight_.end() && it->first.peer == key.peer && it->first.seq == key.seq; ++it) {
    if (fingerprintOf(it->second->first) != fp) {
      return matchCheck(*req, it->second->first, key.peer);
    }
  }
  // Each lane carries calls in order: if a lane this message needs already carried a later
  // call, the message is not coming.
  for (const Part& part : partsOf(*req)) {
    const Lane& l = lane(req->peer, part.lane);
    if (l.lastSeq > key.seq) return skipped(*req, l.lastSeq);
    if (l.closed) return closedError(req->peer, *req);
  }
  posted_[key] = req;
  return Status::ok();
}

// A receive meets a message that arrived before it (whole or in part).
void Matcher::attach(const IncomingPtr& msg, const RequestPtr& req) {
  msg->req = req;
  if (o_.landsInOrder && msg->heap) {
    // What came so far is a prefix; the rest lands straight in the caller's buffer.
    std::memcpy(req->buf, msg->heap.get(), msg->landed);
    msg->heap.reset();
  }
  if (msg->complete()) deliver(msg);
}

void Matcher::deliver(const IncomingPtr& msg) {
  if (msg->first.op != OpType::kSendRecv) {
    inflight_.erase(Key{msg->peer, msg->first.seq, msg->first.tag});
  } else {
    arrivingP2P_.erase(std::remove(arrivingP2P_.begin(), arrivingP2P_.end(), msg),
                       arrivingP2P_.end());
  }
  if (msg->heap) std::memcpy(msg->req->buf, msg->heap.get(), msg->first.total);
  if (o_.delivered) o_.delivered(msg->peer, msg->first.total);
  msg->req->complete(Status::ok(), msg->peer);  // last: its callback may fail the transport
}

bool Matcher::p2pUnreachable(const BasicRequest& recv) const {
  const auto unreachable = [&](int peer) {
    for (const Part& part : partsOf(recv)) {
      if (lane(peer, part.lane).closed) return true;
    }
    return false;
  };
  if (recv.peer != kAnySource) return unreachable(recv.peer);
  for (int p = 0; p < o_.size; ++p) {
    if (p != o_.rank && !unreachable(p)) return false;
  }
  return o_.size > 1;
}

// ---- arrivals -------------------------------------------------------------------------------

Result<Matcher::IncomingPtr> Matcher::onFrame(int peer, int laneIndex, const FrameHeader& h) {
  const std::string from =
      "rank " + std::to_string(o_.rank) + ": from rank " + std::to_string(peer) + ": ";
  if (peer < 0 || peer >= o_.size || peer == o_.rank || laneIndex < 0 || laneIndex >= o_.lanes) {
    return internalError(from + "frame on lane " + std::to_string(laneIndex) + " of " +
                         std::to_string(o_.lanes));
  }
  Lane& l = lane(peer, laneIndex);
  const bool collective = h.op != OpType::kSendRecv;
  if (collective && h.seq > l.lastSeq) {
    l.lastSeq = h.seq;
    NANOCCL_CHECK(checkSkipped(peer, laneIndex));
  }
  IncomingPtr msg = l.current;
  if (msg) {
    const FrameHeader& f = msg->first;
    if (h.op != f.op || h.seq != f.seq || h.tag != f.tag || h.total != f.total ||
        fingerprintOf(h) != fingerprintOf(f)) {
      return protocolError(from + "a frame of " + fingerprintOf(h).describe() + " tag " +
                           std::to_string(h.tag) + " interrupts " + fingerprintOf(f).describe() +
                           " tag " + std::to_string(f.tag) + " on lane " +
                           std::to_string(laneIndex));
    }
  } else if (auto it = collective ? inflight_.find(Key{peer, h.seq, h.tag}) : inflight_.end();
             it != inflight_.end()) {
    msg = it->second;  // another lane's part of it came first
    if (fingerprintOf(msg->first) != fingerprintOf(h) || msg->first.total != h.total) {
      return protocolError(from + "inconsistent parts of one message of " +
                           fingerprintOf(msg->first).describe());
    }
  } else {
    NANOCCL_ASSIGN_OR_RETURN(msg, startMessage(peer, h));
  }

  size_t i = 0;
  while (i < msg->parts.size() && msg->parts[i].lane != laneIndex) ++i;
  if (i == msg->parts.size()) {
    return protocolError(from + fingerprintOf(h).describe() + " tag " + std::to_string(h.tag) +
                         " arrived on lane " + std::to_string(laneIndex) +
                         ", which its message does not use");
  }
  const Part& part = msg->parts[i];
  const bool started = (msg->startedLanes >> laneIndex & 1) != 0;
  if ((started && msg->announced[i] == part.length) ||
      h.offset != part.offset + msg->announced[i] ||
      h.length > part.length - msg->announced[i]) {
    return protocolError(from + "frame [" + std::to_string(h.offset) + ", +" +
                         std::to_string(h.length) + ") of " + fingerprintOf(h).describe() +
                         " tag " + std::to_string(h.tag) +
                         (started && msg->announced[i] == part.length
                              ? " repeats a part already sent"
                              : " does not continue its part [" + std::to_string(part.offset) +
                                    ", +" + std::to_string(part.length) + ")"));
  }
  msg->startedLanes |= uint64_t{1} << laneIndex;
  msg->announced[i] += h.length;
  l.current = msg->announced[i] == part.length ? nullptr : msg;
  return msg;
}

// The first frame of a message: match it to a posted receive, or hold it.
Result<Matcher::IncomingPtr> Matcher::startMessage(int peer, const FrameHeader& h) {
  auto msg = std::make_shared<Incoming>();
  msg->peer = peer;
  msg->first = h;
  msg->parts = partsOf(h);
  msg->announced.assign(msg->parts.size(), 0);
  const auto hold = [&]() -> Status {
    if (h.total == 0) return Status::ok();
    // The size was validated against kMaxMessageBytes and comes from an authenticated peer.
    msg->heap.reset(new (std::nothrow) char[h.total]);
    if (msg->heap) return Status::ok();
    return internalError("rank " + std::to_string(o_.rank) + ": cannot hold an early " +
                         std::to_string(h.total) + "-byte message from rank " +
                         std::to_string(peer));
  };

  if (h.op == OpType::kSendRecv) {
    NANOCCL_TRACE("rank " << o_.rank << ": p2p message from " << peer << " tag " << h.tag);
    for (auto it = postedP2P_.begin(); it != postedP2P_.end(); ++it) {
      const BasicRequest& r = **it;
      if (r.env.tag != h.tag || (r.peer != kAnySource && r.peer != peer)) continue;
      NANOCCL_CHECK(matchCheck(r, h, peer));
      msg->req = *it;
      postedP2P_.erase(it);
      arrivingP2P_.push_back(msg);
      return msg;
    }
    NANOCCL_CHECK(hold());
    unexpectedP2P_.push_back(msg);
    return msg;
  }

  const Key key{peer, h.seq, h.tag};
  for (auto it = posted_.lower_bound(Key{peer, h.seq, 0});
       it != posted_.end() && it->first.peer == peer && it->first.seq == h.seq; ++it) {
    if (it->second->env.fingerprint != fingerprintOf(h)) return matchCheck(*it->second, h, peer);
  }
  if (auto it = posted_.find(key); it != posted_.end()) {
    NANOCCL_CHECK(matchCheck(*it->second, h, peer));
    msg->req = it->second;
    posted_.erase(it);
  } else {
    NANOCCL_CHECK(hold());
  }
  inflight_[key] = msg;
  return msg;
}

// A frame of call #lastSeq came on `laneIndex` from `peer`: receives for earlier calls that
// need this lane will never be met, and earlier messages must have sent their part on it.
Status Matcher::checkSkipped(int peer, int laneIndex) {
  const uint64_t last = lane(peer, laneIndex).lastSeq;
  for (auto it = posted_.lower_bound(Key{peer, 0, 0});
       it != posted_.end() && it->first.peer == peer && it->first.seq < last; ++it) {
    for (const Part& part : partsOf(*it->second)) {
      if (part.lane == laneIndex) return skipped(*it->second, last);
    }
  }
  for (auto it = inflight_.lower_bound(Key{peer, 0, 0});
       it != inflight_.end() && it->first.peer == peer && it->first.seq < last; ++it) {
    const Incoming& m = *it->second;
    for (const Part& part : m.parts) {
      if (part.lane == laneIndex && !(m.startedLanes >> laneIndex & 1)) {
        return protocolError("rank " + std::to_string(o_.rank) + ": rank " +
                             std::to_string(peer) + " left a part of " +
                             fingerprintOf(m.first).describe() + " unsent");
      }
    }
  }
  return Status::ok();
}

void Matcher::landed(const IncomingPtr& msg, uint64_t bytes) {
  msg->landed += bytes;
  if (msg->complete() && msg->req) deliver(msg);
}

bool Matcher::hasReceiveFor(int peer, const FrameHeader& h) const {
  if (h.op != OpType::kSendRecv) return posted_.count(Key{peer, h.seq, h.tag}) != 0;
  for (const RequestPtr& r : postedP2P_) {
    if (r->env.tag == h.tag && (r->peer == kAnySource || r->peer == peer)) return true;
  }
  return false;
}

bool Matcher::midMessage(int peer, int laneIndex) const {
  return lane(peer, laneIndex).current != nullptr;
}

std::vector<Matcher::AwaitedLane> Matcher::awaitedLanes(int peer) const {
  std::vector<AwaitedLane> out;
  const auto add = [&](const Incoming& m) {
    if (m.peer != peer || !m.req || m.complete()) return;
    for (size_t i = 0; i < m.parts.size(); ++i) {
      if (m.announced[i] < m.parts[i].length) {
        out.push_back({m.parts[i].lane, m.parts[i].length - m.announced[i]});
      }
    }
  };
  for (const auto& [key, m] : inflight_) add(*m);
  for (const IncomingPtr& m : arrivingP2P_) add(*m);
  // The latest call `peer` has sent frames of. A posted receive for an earlier call whose lane
  // had carried a later one has already failed (checkSkipped), so each lane of those left is
  // behind the others: the part on it is stuck, not unsent.
  uint64_t latest = 0;
  for (int l = 0; l < o_.lanes; ++l) latest = std::max(latest, lane(peer, l).lastSeq);
  for (auto it = posted_.lower_bound(Key{peer, 0, 0});
       it != posted_.end() && it->first.peer == peer && it->first.seq < latest; ++it) {
    for (const Part& part : partsOf(*it->second)) out.push_back({part.lane, part.length});
  }
  return out;
}

// ---- closing and failing --------------------------------------------------------------------

Matcher::RequestPtr Matcher::laneClosed(int peer, int laneIndex) {
  Lane& l = lane(peer, laneIndex);
  l.closed = true;
  l.current.reset();
  for (auto it = posted_.lower_bound(Key{peer, 0, 0});
       it != posted_.end() && it->first.peer == peer; ++it) {
    for (const Part& part : partsOf(*it->second)) {
      if (part.lane == laneIndex) return it->second;
    }
  }
  // Matched messages whose part on this lane has not come whole.
  const auto stuck = [&](const Incoming& m) {
    if (m.peer != peer || !m.req) return false;
    for (size_t i = 0; i < m.parts.size(); ++i) {
      if (m.parts[i].lane != laneIndex) continue;
      if (!(m.startedLanes >> laneIndex & 1) || m.announced[i] < m.parts[i].length) return true;
    }
    return false;
  };
  for (const auto& [key, m] : inflight_) {
    if (stuck(*m)) return m->req;
  }
  for (const IncomingPtr& m : arrivingP2P_) {
    if (stuck(*m)) return m->req;
  }
  for (const RequestPtr& r : postedP2P_) {
    if ((r->peer == peer || r->peer == kAnySource) && p2pUnreachable(*r)) return r;
  }
  return nullptr;
}

bool Matcher::closed(int peer) const {
  for (int l = 0; l < o_.lanes; ++l) {
    if (!lane(peer, l).closed) return false;
  }
  return true;
}

bool Matcher::hasPending() const {
  if (!posted_.empty() || !postedP2P_.empty() || !arrivingP2P_.empty()) return true;
  for (const auto& [k, m] : inflight_) {
    if (m->req) return true;
  }
  return false;
}

std::vector<Matcher::RequestPtr> Matcher::takeAll() {
  std::vector<RequestPtr> out;
  for (auto& [k, r] : posted_) out.push_back(r);
  for (auto& r : postedP2P_) out.push_back(r);
  for (auto& [k, m] : inflight_) {
    if (m->req) out.push_back(m->req);
  }
  for (auto& m : arrivingP2P_) out.push_back(m->req);
  posted_.clear();
  postedP2P_.clear();
  inflight_.clear();
  arrivingP2P_.clear();
  unexpectedP2P_.clear();
  for (Lane& l : lanes_) l.current.reset();
  return out;
}

}  // namespace nanoccl
