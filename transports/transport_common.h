// What every transport keeps the same way, beside the Matcher (matcher.h): its byte counters
// (read from any thread while the progress state's owner adds to them), the flag abort() waits
// on until no operation targets a caller's buffer, and how a failure is logged.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/logging.h"
#include "common/status.h"
#include "transports/matcher.h"
#include "transports/request.h"
#include "transports/transport.h"

namespace nanoccl {

// Payload bytes and messages per peer (Transport::counters()).
class TransportCounters {
 public:
  explicit TransportCounters(int size) : c_(static_cast<size_t>(size)) {}
  std::vector<PeerCounters> snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return c_;
  }
  void sent(int peer, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    c_[static_cast<size_t>(peer)].bytesSent += bytes;
    c_[static_cast<size_t>(peer)].messagesSent += 1;
  }
  void received(int peer, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    c_[static_cast<size_t>(peer)].bytesReceived += bytes;
    c_[static_cast<size_t>(peer)].messagesReceived += 1;
  }
  void closed(int peer) {
    std::lock_guard<std::mutex> lock(mu_);
    c_[static_cast<size_t>(peer)].connectionsClosed += 1;
  }

 private:
  mutable std::mutex mu_;
  std::vector<PeerCounters> c_;
};

// Set once, by the owner of the progress state, when a failed transport no longer has any
// operation on a caller's buffer; abort() waits for it.
class DrainedFlag {
 public:
  void set() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (set_) return;
      set_ = true;
    }
    cv_.notify_all();
  }
  // Whether it was set within `d`.
  template <typename Duration>
  bool waitFor(Duration d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, d, [&] { return set_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

// isend()/irecv()'s common start: a request naming a bad peer or size, or made before
// connect(), completes at once with the error (checkRequest); any other goes to `post`.
template <typename Req, typename Post>
std::shared_ptr<Request> startRequest(std::shared_ptr<Req> req, int rank, int size,
                                      bool connected, Post&& post) {
  if (Status st = checkRequest(rank, size, *req, connected); !st.isOk()) {
    req->complete(st, -1);
  } else {
    post(req);
  }
  return req;
}

// The matcher options every transport starts from: its rank and size, deliveries counted.
inline MatcherOptions matcherOptionsFor(const TransportOptions& o, TransportCounters* counters) {
  MatcherOptions mo;
  mo.rank = o.rank;
  mo.size = o.size;
  mo.delivered = [counters](int peer, uint64_t bytes) { counters->received(peer, bytes); };
  return mo;
}

// A transport failing with work pending is worth a warning; one closing idle (a peer that
// finished and left) is the normal end of a job.
inline void logTransportFailure(int rank, const Status& why, bool pending) {
  if (pending) {
    NANOCCL_WARN("rank " << rank << ": transport failed: " << why.toString());
  } else {
    NANOCCL_INFO("rank " << rank << ": transport closed: " << why.toString());
  }
}

}  // namespace nanoccl
