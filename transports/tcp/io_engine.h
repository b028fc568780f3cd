// IoEngine: the small socket-operations interface the TCP transport runs on (in the spirit of
// libfabric's ofi_sockapi). Two engines implement it: io_uring (io_engine_uring.cc) and epoll
// (io_engine_epoll.cc); createEngine() probes io_uring at start-up and falls back to epoll with
// one log line when the kernel, its io_uring_disabled setting or a seccomp filter refuses it.
//
// Threads and ownership
// - One engine per progress thread. postRecv/postSend/sendNow/poll are called from that
//   thread only, addSocket() before it polls (setup); wakeup() may be called from any thread.
// - At most one receive and one send may be pending per socket. An operation completes when
//   all its bytes have moved (short transfers are continued inside the engine), or with an
//   error: result < 0 is -errno, and a receive that meets end-of-stream completes with
//   result 0. Buffers and iovec targets stay owned by the caller until the completion.
// - Completions are delivered only from poll(), never from inside a post call.
// - A socket added with keys is sealed (NANOCCL_ENCRYPT=1): its bytes travel as records, each
//   AES-256-GCM sealed under its direction's key and record counter (crypto::Aead), each
//   followed by its tag. A send seals each iov entry as records of at most kRecordBytes (a
//   frame's header, then its payload) into the op's staging buffer, as many as it holds (a
//   header and kRecordsPerSend whole records), and seals the next ones once those have left; a
//   receive of `len` bytes reads records of at most kRecordBytes (so the receiver must cut its
//   receives as the sender cut its iov entries: a frame's header alone, then its payload) and
//   opens each into the caller's buffer. The callers see plaintext and its byte counts only; a
//   record that does not open completes the receive with -EBADMSG and the reason.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/crypto.h"
#include "common/status.h"
#include "transports/frame.h"

namespace nanoccl::tcp {

// Sealed sockets' records (see above).
constexpr uint64_t kRecordBytes = 256 * 1024;
constexpr uint64_t kRecordsPerSend = 2;
constexpr uint64_t kSealedHeaderBytes = sizeof(FrameHeader) + crypto::kTagBytes;

struct IoCompletion {
  void* cookie;    // as given to the post call
  bool send;       // which of the socket's two operations it ends
  int64_t result;  // bytes moved (the full length), 0 at end-of-stream, or -errno
  // Why, where this side failed the operation: -EBADMSG, a sealed record that did not open;
  // -EPROTO, one that could not be sealed, or a bad request (too many iov entries).
  Status error;
};

// What both engines share: the sockets and their one receive and one send, the bookkeeping of
// a transfer (what is left of its iovec), the completions batched for poll(), and the eventfd
// wakeup() writes. An engine says how a transfer starts and how it waits for events.
class IoEngine {
 public:
  virtual ~IoEngine();
  virtual const char* name() const = 0;  // "uring" or "epoll"

  // Registers a connected, non-blocking socket, sealed with `keys` (this side's tx and rx
  // keys, from the handshake) where given.
  struct Keys {
    crypto::Key tx, rx;
  };
  Status addSocket(int fd, const Keys* keys = nullptr);

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
  // Sends iov[0..iovcnt) at once, sealed where the socket is, as far as the socket takes it
  // without blocking, and forgets it (no completion): how a failing transport tells a peer on
  // a connection with no send posted (with one posted, it does nothing). iovcnt <= kMaxIov.
  void sendNow(int fd, const iovec* iov, int iovcnt);

 protected:
  // One transfer: a socket's receive or send.
  struct Op {
    enum Kind { kRecv, kSend, kWake } kind = kRecv;
    int fd = -1;
    bool active = false;
    iovec iov[kMaxIov];  // what is left to move: iov[0] is the next byte
    int iovcnt = 0;
    msghdr msg{};  // a send's, pointing at iov (io_uring reads it while the send runs)
    size_t left = 0;   // wire bytes
    size_t total = 0;  // the caller's bytes
    void* cookie = nullptr;
    // A sealed socket's: the caller's bytes still to seal or open (plain[0] is the next), the
    // records on the wire (`stage`, what iov moves), a receive's record's plaintext bytes.
    std::optional<crypto::Aead> aead;
    std::vector<char> stage;
    iovec plain[kMaxIov];
    int plainCnt = 0;
    size_t record = 0;
  };
  struct Socket {
    Op recv;
    Op send;
  };

  // Opens the eventfd wakeup() writes (`flags`: EFD_* besides EFD_CLOEXEC).
  Status openWakeFd(int flags);
  // The engine's part of addSocket() (epoll: its interest list).
  virtual Status watch(int fd) { return Status::ok(); }
  // A posted transfer with bytes to move starts.
  virtual void start(Op& op) = 0;
  // Waits up to timeoutMs (0: not at all, -1: no limit) for events and moves transfers on.
  virtual Status reap(int timeoutMs) = 0;

  // `op` ends with `result` (its completion waits for poll() to deliver it).
  void finish(Op& op, int64_t result, Status error = Status::ok());
  // `n` more bytes of `op` moved; finishes it when none are left (a sealed op: when no record
  // is left; else the next one is on the wire iov). Returns whether it finished.
  bool advance(Op& op, size_t n);

  std::unordered_map<int, std::unique_ptr<Socket>> sockets_;  // stable addresses: io_uring's
  int wakeFd_ = -1;

 private:
  Status post(Op& op, const iovec* iov, int iovcnt, void* cookie);
  // Makes iov[0..iovcnt) (its non-empty entries) `op`'s bytes, and a sealed op's first records.
  Status load(Op& op, const iovec* iov, int iovcnt);
  // A sealed op: puts its next records on the wire iov (a send: sealed from plain; a receive:
  // the next record's room in stage).
  Status nextRecords(Op& op);
  // A sealed receive's record has arrived: opens it into plain. False (and the op finished
  // with -EBADMSG) where it does not open.
  bool openRecord(Op& op);

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
