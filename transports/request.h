// BasicRequest: the Request that every transport shares (tcp, shm, fabric, routed): one pending
// send or receive.
//
// Created on the caller's thread; completed exactly once on the transport's progress thread
// (the first complete() wins: common/completion.h), which then runs the callback outside the
// lock. test/wait/source may be called from any thread; wait() polls for the transport's spin
// budget before it sleeps (common/spin.h). A transport subclasses it for its progress-thread
// state.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "common/completion.h"
#include "transports/frame.h"
#include "transports/transport.h"

namespace nanoccl {

class BasicRequest : public Request {
 public:
  // `spin`: how long wait() polls before it sleeps (NANOCCL_SPIN_US, common/spin.h).
  BasicRequest(bool isSend, int peer, const Envelope& env, char* buf, size_t bytes,
               std::chrono::microseconds spin = {})
      : isSend(isSend), peer(peer), env(env), buf(buf), bytes(bytes), spin_(spin) {}

  bool test() override { return done_.done(); }

  Status wait(const Deadline& deadline) override {
    if (!done_.wait(deadline, spin_)) {
      return timeoutError(std::string(isSend ? "send to" : "receive from") + " rank " +
                          (peer == kAnySource ? std::string("any") : std::to_string(peer)) +
                          " of " + env.fingerprint.describe() + " tag " +
                          std::to_string(env.tag) + " did not complete before the deadline");
    }
    return done_.status();
  }

  int source() const override { return done_.source(); }

  void setCallback(std::function<void(const Status&, int)> cb) override {
    done_.onComplete(std::move(cb));
  }

  // Progress thread only; the first completion wins.
  void complete(const Status& st, int src) { done_.complete(st, src); }

  const bool isSend;
  const int peer;
  const Envelope env;
  char* const buf;
  const size_t bytes;

 private:
  const std::chrono::microseconds spin_;
  Completion done_;
};

// The checks both transports make on a request and on the message that meets it, worded once
// so that tcp and shm report the same situation in the same words.

// A peer rank `req` may name (kAnySource only for a point-to-point receive, where there is a
// peer), a size the frame format can carry, and a transport that is connected.
inline Status checkRequest(int rank, int size, const BasicRequest& req, bool connected) {
  const bool anySource = !req.isSend && req.peer == kAnySource &&
                         req.env.fingerprint.op == OpType::kSendRecv && size > 1;
  const int peer = req.peer;
  if (!anySource && (peer < 0 || peer >= size || peer == rank)) {
    return invalidArgument("rank " + std::to_string(rank) + ": invalid peer rank " +
                           std::to_string(peer) + " (communicator size " + std::to_string(size) +
                           ")");
  }
  if (req.bytes > kMaxMessageBytes) {
    return invalidArgument("message larger than the transport's limit");
  }
  if (!connected) return invalidArgument("transport used before connect()");
  return Status::ok();
}

// Whether a message announced by `h` from rank `from` is what `req` (posted on `rank`) expects:
// kMismatch naming both ranks and both calls otherwise.
inline Status checkMessageMatch(int rank, const BasicRequest& req, const FrameHeader& h,
                                int from) {
  const OpFingerprint theirs = fingerprintOf(h);
  const OpFingerprint& ours = req.env.fingerprint;
  if (theirs == ours && h.total == req.bytes) return Status::ok();
  std::string detail;
  if (theirs == ours) {
    detail = " with " + std::to_string(h.total) + " bytes where rank " + std::to_string(rank) +
             " expects " + std::to_string(req.bytes);
  }
  return mismatchError("rank " + std::to_string(rank) + " called " + ours.describe() +
                       " but rank " + std::to_string(from) + " called " + theirs.describe() +
                       detail);
}

// `req`'s sender has already sent call #theirSeq on the way `req`'s message had to take.
inline Status skippedCallError(int rank, const BasicRequest& req, uint64_t theirSeq) {
  return mismatchError("rank " + std::to_string(rank) + " waits in " +
                       req.env.fingerprint.describe() + " for rank " + std::to_string(req.peer) +
                       ", but rank " + std::to_string(req.peer) +
                       " has already moved on to call #" + std::to_string(theirSeq) +
                       " (the ranks do not make the same calls)");
}

}  // namespace nanoccl
