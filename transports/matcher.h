// Matcher: the message matching every transport shares (transport.h, "Matching" and
// "Failure"). A transport keeps only what moves bytes; it hands each posted receive and each
// arriving frame header to its Matcher, which holds the tables and makes every check:
//
// - Receives and messages meet on (peer, seq, tag) for collectives, in sending order on
//   (peer, tag) for point-to-point messages (kAnySource: from any peer). A message that
//   arrives before its receive is held in a buffer of the announced size and copied out when
//   the receive comes.
// - The sender's fingerprint and length are checked against the receiver's, for the message
//   itself and for every other message of the same call from the same peer (they all carry
//   one fingerprint): a difference is kMismatch naming both ranks and both calls.
// - Lanes. A transport carries a peer's messages on one or more ordered lanes (tcp: its
//   connections; shm: one ring) and says, through `parts`, which bytes of a message travel on
//   which lane. A frame on a lane its message does not use, or one that does not continue its
//   part, is a protocol error. Each lane delivers calls in order, so a frame of call #S on a
//   lane means that receives for earlier calls waiting on that lane will never be satisfied
//   (kMismatch: the ranks do not make the same calls). A lane the peer closed in order fails
//   only what still needs it (laneClosed()).
//
// Threads: a Matcher belongs to whoever holds the transport's progress (its progress thread,
// or a thread driving it); it takes no locks. It never completes a request with an error
// itself: a check that fails returns the Status, and the transport fails as a whole with it
// (its one failure path), collecting the requests the Matcher holds with takeAll().
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "transports/frame.h"
#include "transports/request.h"

namespace nanoccl {

// The bytes [offset, offset + length) of a message travel on `lane`.
struct Part {
  int lane = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct MatcherOptions {
  int rank = 0;
  int size = 1;
  int lanes = 1;  // per peer, at most 64
  // Which lanes carry which bytes of a message: every byte on exactly one lane, in offset
  // order, one part (lane 0 from offset 0) for an empty message. `op` is kSendRecv for
  // point-to-point messages, whose `seq` is the sender's message number.
  // `lanes` is the message's OpFingerprint::lanes (0: every lane).
  std::function<std::vector<Part>(OpType op, uint64_t seq, uint32_t tag, uint64_t total,
                                  int lanes)>
      parts;
  // Frames land synchronously and in order (shm copies them as they come): a receive that
  // meets a partly arrived message takes the bytes held so far and the rest lands directly in
  // its buffer. Otherwise (tcp, where a held part may still be in flight) it is copied out
  // once the whole message is in.
  bool landsInOrder = false;
  // A message was delivered to its receive (payload bytes, for the transport's counters).
  std::function<void(int peer, uint64_t bytes)> delivered;
};

class Matcher {
 public:
  using RequestPtr = std::shared_ptr<BasicRequest>;

  // One message with at least one frame seen.
  struct Incoming {
    int peer = -1;
    FrameHeader first{};  // the first frame's header: fingerprint and total
    RequestPtr req;       // the matched receive, once posted
    std::unique_ptr<char[]> heap;  // where it lands while unexpected
    std::vector<Part> parts;
    std::vector<uint64_t> announced;  // per part: bytes announced by its frames so far
    uint64_t startedLanes = 0;        // lanes whose part has had a frame
    uint64_t landed = 0;              // payload bytes written (landed())

    bool complete() const { return landed == first.total; }
    // Where the bytes at `offset` go: the held buffer, else the receive's.
    char* dest(uint64_t offset) const { return (heap ? heap.get() : req->buf) + offset; }
  };
  using IncomingPtr = std::shared_ptr<Incoming>;

  explicit Matcher(MatcherOptions options);

  // The sequence number a send puts in its frame headers: the call's for a collective, the
  // next message number to that peer for point-to-point.
  uint64_t wireSeq(const BasicRequest& send);

  // A receive is posted. OK: the Matcher holds it (or it met a complete message and has
  // completed). Otherwise the Matcher does not hold it and the transport must fail with the
  // Status and then complete `req`; kPeerError means a lane it needs is closed.
  Status postRecv(const RequestPtr& req);

  // A data frame header from `peer` on `lane`, already checked by validateFrameHeader. OK:
  // the message it belongs to; its h.length payload bytes go to msg->dest(h.offset), and
  // landed() is called once they are there.
  Result<IncomingPtr> onFrame(int peer, int lane, const FrameHeader& h);

  // `bytes` of `msg`'s payload are in place. Delivers it once complete and matched.
  void landed(const IncomingPtr& msg, uint64_t bytes);

  // Whether a receive is posted for the message `h` (from `peer`) starts. No checks.
  bool hasReceiveFor(int peer, const FrameHeader& h) const;

  // The peer closed `lane` in order after its last frame. Returns a request that can now never
  // complete (it needed more from that lane), or nullptr.
  RequestPtr laneClosed(int peer, int lane);
  // Whether every lane of `peer` is closed.
  bool closed(int peer) const;

  // kPeerError: `peer` (or every peer, for kAnySource) closed a lane `req` still needs.
  Status closedError(int peer, const BasicRequest& req) const;

  // Whether a message from `peer` on `lane` has frames still to come.
  bool midMessage(int peer, int lane) const;

  // For a receive that timed out: the lanes from which a message of `peer` still needs bytes,
  // with how many. Listed: a message matched to a posted receive and partly arrived (some lane
  // has had a frame; a striped message one of whose links went down), and a receive nothing
  // has arrived for while the peer has sent frames of a later call on another lane (it made
  // this call: what it sent on the receive's lanes is stuck). Receives that have seen nothing,
  // from a peer that has not gone past their call, are not listed (it may not have made it).
  struct AwaitedLane {
    int lane;
    uint64_t bytes;
  };
  std::vector<AwaitedLane> awaitedLanes(int peer) const;

  // Whether a receive is posted or a matched message is still arriving.
  bool hasPending() const;
  // Every request the Matcher holds; the tables are cleared (the transport is failing). A
  // transport still writing into one of their buffers completes that one when it is done.
  std::vector<RequestPtr> takeAll();

 private:
  struct Key {
    int peer;
    uint64_t seq;
    uint32_t tag;
    auto operator<=>(const Key&) const = default;
  };
  struct Lane {
    uint64_t lastSeq = 0;  // highest collective call seen on it
    bool closed = false;
    IncomingPtr current;   // the message whose part on this lane is not fully announced
  };

  Lane& lane(int peer, int l) { return lanes_[static_cast<size_t>(peer * o_.lanes + l)]; }
  const Lane& lane(int peer, int l) const {
    return lanes_[static_cast<size_t>(peer * o_.lanes + l)];
  }
  std::vector<Part> partsOf(const FrameHeader& h) const;
  std::vector<Part> partsOf(const BasicRequest& recv) const;
  Status matchCheck(const BasicRequest& req, const FrameHeader& h, int from) const;
  Status skipped(const BasicRequest& req, uint64_t theirSeq) const;
  Result<IncomingPtr> startMessage(int peer, const FrameHeader& h);
  Status checkSkipped(int peer, int lane);
  void attach(const IncomingPtr& msg, const RequestPtr& req);
  void deliver(const IncomingPtr& msg);
  bool p2pUnreachable(const BasicRequest& recv) const;

  const MatcherOptions o_;
  std::vector<Lane> lanes_;           // [peer * lanes + lane]
  std::vector<uint64_t> p2pSent_;     // per peer: point-to-point messages numbered so far
  std::map<Key, RequestPtr> posted_;  // collective receives not yet met by a message
  std::map<Key, IncomingPtr> inflight_;  // collective messages seen, not yet delivered
  std::deque<RequestPtr> postedP2P_;
  std::deque<IncomingPtr> unexpectedP2P_;
  std::vector<IncomingPtr> arrivingP2P_;  // matched point-to-point messages still arriving
};

}  // namespace nanoccl
