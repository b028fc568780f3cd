// TcpRequest: one pending send or receive of the TCP transport (transport.h's Request).
//
// Created on the caller's thread; completed exactly once on the progress thread (the first
// complete() wins), which then runs the callback outside the lock. test/wait/source may be
// called from any thread. The fields after the constructor's are the progress thread's alone.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "transports/transport.h"

namespace nanoccl::tcp {

class TcpRequest : public Request {
 public:
  TcpRequest(bool isSend, int peer, const Envelope& env, char* buf, size_t bytes)
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
  // Progress-thread state.
  size_t framesLeft = 0;   // send: frames not yet written
  uint64_t postOrder = 0;  // receive: order of posting, for kAnySource fairness

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  int source_ = -1;
  std::function<void(const Status&, int)> callback_;
};

}  // namespace nanoccl::tcp
