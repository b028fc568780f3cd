// BasicRequest: the Request that the transports share (tcp, shm): one pending send or receive.
//
// Created on the caller's thread; completed exactly once on the transport's progress thread
// (the first complete() wins), which then runs the callback outside the lock. test/wait/source
// may be called from any thread. A transport subclasses it for its progress-thread state.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "transports/transport.h"

namespace nanoccl {

class BasicRequest : public Request {
 public:
  BasicRequest(bool isSend, int peer, const Envelope& env, char* buf, size_t bytes)
      : isSend(isSend), peer(peer), env(env), buf(buf), bytes(bytes) {}

  bool test() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  Status wait(const Deadline& deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.at(), [&] { return done_; })) {
      return timeoutError(std::string(isSend ? "send to" : "receive from") + " rank " +
                          (peer == kAnySource ? std::string("any") : std::to_string(peer)) +
                          " of " + env.fingerprint.describe() + " tag " +
                          std::to_string(env.tag) + " did not complete before the deadline");
    }
    return status_;
  }

  int source() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return source_;
  }

  void setCallback(std::function<void(const Status&, int)> cb) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!done_) {
      callback_ = std::move(cb);
      return;
    }
    const Status st = status_;
    const int src = source_;
    lock.unlock();
    cb(st, src);
  }

  // Progress thread only; the first completion wins.
  void complete(const Status& st, int src) {
    std::function<void(const Status&, int)> cb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      done_ = true;
      status_ = st;
      source_ = src;
      cb = std::move(callback_);
    }
    cv_.notify_all();
    if (cb) cb(st, src);
  }

  const bool isSend;
  const int peer;
  const Envelope env;
  char* const buf;
  const size_t bytes;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  int source_ = -1;
  std::function<void(const Status&, int)> callback_;
};

}  // namespace nanoccl
