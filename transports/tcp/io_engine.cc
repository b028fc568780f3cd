// What the IoEngines share (io_engine.h), and createEngine(): io_uring where the kernel allows
// it, else epoll.
#include "transports/tcp/io_engine.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "common/logging.h"

namespace nanoccl::tcp {

Result<std::unique_ptr<IoEngine>> createEngine(const std::string& which) {
  if (which == "epoll") return createEpollEngine();
  if (which == "uring") {
    auto engine = createUringEngine();
    if (!engine.isOk()) {
      return unavailableError("NANOCCL_TCP_ENGINE=uring, but io_uring is not usable here: " +
                              engine.status().message());
    }
    return engine;
  }
  if (which != "auto") {
    return invalidArgument("NANOCCL_TCP_ENGINE=" + which + ": expected auto, uring or epoll");
  }
  auto engine = createUringEngine();
  if (engine.isOk()) return engine;
  static std::once_flag once;
  std::call_once(once, [&] {
    NANOCCL_WARN("io_uring unavailable (" << engine.status().message()
                                          << "); using the epoll engine");
  });
  return createEpollEngine();
}

IoEngine::~IoEngine() {
  if (wakeFd_ >= 0) close(wakeFd_);
}

Status IoEngine::openWakeFd(int flags) {
  wakeFd_ = eventfd(0, flags | EFD_CLOEXEC);
  return wakeFd_ < 0 ? systemError("eventfd", errno) : Status::ok();
}

Status IoEngine::addSocket(int fd) {
  auto s = std::make_unique<Socket>();
  s->recv.fd = s->send.fd = fd;
  s->send.kind = Op::kSend;
  NANOCCL_CHECK(watch(fd));
  sockets_[fd] = std::move(s);
  return Status::ok();
}

void IoEngine::removeSocket(int fd) {
  unwatch(fd);
  sockets_.erase(fd);
}

Status IoEngine::postRecv(int fd, void* buf, size_t len, void* cookie) {
  const iovec iov{buf, len};
  return post(sockets_.at(fd)->recv, &iov, 1, cookie);
}

Status IoEngine::postSend(int fd, const iovec* iov, int iovcnt, void* cookie) {
  if (iovcnt < 1 || iovcnt > kMaxIov) {
    return internalError(std::string(name()) + " engine: bad iovcnt");
  }
  return post(sockets_.at(fd)->send, iov, iovcnt, cookie);
}

Status IoEngine::post(Op& op, const iovec* iov, int iovcnt, void* cookie) {
  if (op.active) {
    return internalError(std::string(name()) + " engine: second " +
                         (op.kind == Op::kRecv ? "receive" : "send") + " posted on a socket");
  }
  op.active = true;
  op.cookie = cookie;
  op.iovcnt = 0;
  op.left = 0;
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len == 0) continue;
    op.iov[op.iovcnt++] = iov[i];
    op.left += iov[i].iov_len;
  }
  op.total = op.left;
  if (op.left == 0) {
    finish(op, 0);
  } else {
    start(op);
  }
  return Status::ok();
}

void IoEngine::wakeup() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = write(wakeFd_, &one, sizeof(one));
}

Status IoEngine::poll(int timeoutMs, const std::function<void(const IoCompletion&)>& fn) {
  NANOCCL_CHECK(reap(ready_.empty() ? timeoutMs : 0));
  // Callbacks may post new operations (which may complete at once into ready_): swap first.
  std::vector<IoCompletion> batch;
  batch.swap(ready_);
  for (const IoCompletion& c : batch) fn(c);
  return Status::ok();
}

void IoEngine::finish(Op& op, int64_t result) {
  op.active = false;
  ready_.push_back({op.cookie, result});
}

bool IoEngine::advance(Op& op, size_t n) {
  op.left -= n;
  advanceIov(op.iov, op.iovcnt, n);
  if (op.left > 0) return false;
  finish(op, static_cast<int64_t>(op.total));
  return true;
}

}  // namespace nanoccl::tcp
