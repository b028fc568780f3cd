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

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace nanoccl::tcp {

struct IoCompletion {
  void* cookie;    // as given to the post call
  int64_t result;  // bytes moved (the full length), 0 at end-of-stream, or -errno
};

// What both engines share: the sockets and their one receive and one send, the bookkeeping of
// a transfer (what is left of its iovec), the completions batched for poll(), and the eventfd
// wakeup() writes. An engine says how a transfer starts and how it waits for events.
class IoEngine {
 public:
  virtual ~IoEngine();
  virtual const char* name() const = 0;  // "uring" or "epoll"

  // Registers a connected, non-blocking socket / forgets it (its pending operations must
  // have completed, or it must have been shut down and drained first).
  Status addSocket(int fd);
  void removeSocket(int fd);

  // Receives exactly `len` bytes into `buf`.
  Status postRecv(int fd, void* buf, size_t len, void* cookie);
  // Sends all bytes of iov[0..iovcnt) (iovcnt <= kMaxIov). The iovec array is copied.
  static constexpr int kMaxIov = 4;
  Status postSend(int fd, const iovec* iov, int iovcnt, void* cookie);

  // Waits up to timeoutMs (-1: until something happens) for completions and calls `fn` for
  // each, in batches. Returns when at least one completion ran, on wakeup(), or on timeout.
  Status poll(int timeoutMs, const std::function<void(const IoCompletion&)>& fn);
  // Makes a poll() in progress (or the next one) return promptly.
  void wakeup();

 protected:
  // One transfer: a socket's receive or send.
  struct Op {
    enum Kind { kRecv, kSend, kWake } kind = kRecv;
    int fd = -1;
    bool active = false;
    iovec iov[kMaxIov];  // what is left to move: iov[0] is the next byte
    int iovcnt = 0;
    msghdr msg{};  // a send's, pointing at iov (io_uring reads it while the send runs)
    size_t left = 0;
    size_t total = 0;
    void* cookie = nullptr;
  };
  struct Socket {
    Op recv;
    Op send;
  };

  // Opens the eventfd wakeup() writes (`flags`: EFD_* besides EFD_CLOEXEC).
  Status openWakeFd(int flags);
  // The engine's part of addSocket()/removeSocket() (epoll: its interest list).
  virtual Status watch(int fd) { return Status::ok(); }
  virtual void unwatch(int fd) {}
  // A posted transfer with bytes to move starts.
  virtual void start(Op& op) = 0;
  // Waits up to timeoutMs (0: not at all, -1: no limit) for events and moves transfers on.
  virtual Status reap(int timeoutMs) = 0;

  // `op` ends with `result` (its completion waits for poll() to deliver it).
  void finish(Op& op, int64_t result);
  // `n` more bytes of `op` moved; finishes it when none are left. Returns whether it did.
  bool advance(Op& op, size_t n);

  std::unordered_map<int, std::unique_ptr<Socket>> sockets_;  // stable addresses: io_uring's
  int wakeFd_ = -1;

 private:
  Status post(Op& op, const iovec* iov, int iovcnt, void* cookie);

  std::vector<IoCompletion> ready_;
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
