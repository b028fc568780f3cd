// IoEngine: the small socket-operations interface the TCP transport runs on (in the spirit of
// libfabric's ofi_sockapi). Two engines implement it: io_uring (io_engine_uring.cc) and epoll
// (io_engine_epoll.cc); createEngine() probes io_uring at start-up and falls back to epoll with
// one log line when the kernel, its io_uring_disabled setting or a seccomp filter refuses it.
//
// Threads and ownership
// - One engine per progress thread. postRecv/postSend/poll/addSocket/removeSocket are called
//   from that thread only; wakeup() may be called from any thread.
// - At most one receive and one send may be pending per socket. An operation completes when
//   all its bytes have moved (short transfers are continued inside the engine), or with an
//   error: result < 0 is -errno, and a receive that meets end-of-stream completes with
//   result 0. Buffers and iovec targets stay owned by the caller until the completion.
// - Completions are delivered only from poll(), never from inside a post call.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace nanoccl::tcp {

struct IoCompletion {
  void* cookie;    // as given to the post call
  int64_t result;  // bytes moved (the full length), 0 at end-of-stream, or -errno
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual const char* name() const = 0;  // "uring" or "epoll"

  // Registers a connected, non-blocking socket / forgets it (its pending operations must
  // have completed, or it must have been shut down and drained first).
  virtual Status addSocket(int fd) = 0;
  virtual void removeSocket(int fd) = 0;

  // Receives exactly `len` bytes into `buf`.
  virtual Status postRecv(int fd, void* buf, size_t len, void* cookie) = 0;
  // Sends all bytes of iov[0..iovcnt) (iovcnt <= kMaxIov). The iovec array is copied.
  static constexpr int kMaxIov = 4;
  virtual Status postSend(int fd, const iovec* iov, int iovcnt, void* cookie) = 0;

  // Waits up to timeoutMs (-1: until something happens) for completions and calls `fn` for
  // each, in batches. Returns when at least one completion ran, on wakeup(), or on timeout.
  virtual Status poll(int timeoutMs, const std::function<void(const IoCompletion&)>& fn) = 0;
  // Makes a poll() in progress (or the next one) return promptly.
  virtual void wakeup() = 0;
};

// Moves iov[0..iovcnt) past `n` bytes moved: finished entries are dropped, so that iov[0] is
// always the next byte (both engines continue short transfers with it).
inline void advanceIov(iovec* iov, int& iovcnt, size_t n) {
  int i = 0;
  while (n > 0 && i < iovcnt) {
    const size_t take = n < iov[i].iov_len ? n : iov[i].iov_len;
    iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + take;
    iov[i].iov_len -= take;
    n -= take;
    if (iov[i].iov_len == 0) ++i;
  }
  int j = 0;
  for (int k = i; k < iovcnt; ++k) iov[j++] = iov[k];
  iovcnt = j;
}

// "auto": io_uring if the probe passes, else epoll (logged once). "uring": io_uring or
// kUnavailable with the reason. "epoll": epoll.
Result<std::unique_ptr<IoEngine>> createEngine(const std::string& which);

// Whether io_uring works in this process, and why not (for logs and test skips).
Status probeUring();

// The engines, for createEngine(); each returns kUnavailable when compiled out.
Result<std::unique_ptr<IoEngine>> createEpollEngine();
Result<std::unique_ptr<IoEngine>> createUringEngine();

}  // namespace nanoccl::tcp
