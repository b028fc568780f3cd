// What the IoEngines share (io_engine.h), and createEngine(): io_uring where the kernel allows
// it, else epoll.
#include "transports/tcp/io_engine.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
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

Status IoEngine::addSocket(int fd, const Keys* keys) {
  auto s = std::make_unique<Socket>();
  s->recv.fd = s->send.fd = fd;
  s->send.kind = Op::kSend;
  if (keys != nullptr) {
    NANOCCL_ASSIGN_OR_RETURN(s->send.aead, crypto::Aead::create(keys->tx));
    NANOCCL_ASSIGN_OR_RETURN(s->recv.aead, crypto::Aead::create(keys->rx));
    s->send.stage.resize(kSealedHeaderBytes + kRecordsPerSend * (kRecordBytes + crypto::kTagBytes));
    s->recv.stage.resize(kRecordBytes + crypto::kTagBytes);
  }
  NANOCCL_CHECK(watch(fd));
  sockets_[fd] = std::move(s);
  return Status::ok();
}

Status IoEngine::postRecv(int fd, void* buf, size_t len, void* cookie) {
  const iovec iov{buf, len};
  return post(sockets_.at(fd)->recv, &iov, 1, cookie);
}

Status IoEngine::postSend(int fd, const iovec* iov, int iovcnt, void* cookie) {
  return post(sockets_.at(fd)->send, iov, iovcnt, cookie);
}

Status IoEngine::post(Op& op, const iovec* iov, int iovcnt, void* cookie) {
  if (op.active) {
    return internalError(std::string(name()) + " engine: second " +
                         (op.kind == Op::kRecv ? "receive" : "send") + " posted on a socket");
  }
  op.active = true;
  op.cookie = cookie;
  if (Status st = load(op, iov, iovcnt); !st.isOk()) {
    finish(op, -EPROTO, std::move(st));
  } else if (op.total == 0) {
    finish(op, 0);
  } else {
    start(op);
  }
  return Status::ok();
}

Status IoEngine::load(Op& op, const iovec* iov, int iovcnt) {
  if (iovcnt > kMaxIov) return internalError(std::string(name()) + " engine: bad iovcnt");
  op.iovcnt = 0;
  op.total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len == 0) continue;
    op.iov[op.iovcnt++] = iov[i];
    op.total += iov[i].iov_len;
  }
  op.left = op.total;
  if (!op.aead || op.total == 0) return Status::ok();
  std::copy(op.iov, op.iov + op.iovcnt, op.plain);
  op.plainCnt = op.iovcnt;
  return nextRecords(op);
}

Status IoEngine::nextRecords(Op& op) {
  char* stage = op.stage.data();
  size_t used = 0;
  if (op.kind == Op::kRecv) {  // the next record's room
    op.record = std::min<size_t>(kRecordBytes, op.plain[0].iov_len);
    used = op.record + crypto::kTagBytes;
  } else {  // as many records as the stage holds, sealed
    while (op.plainCnt > 0) {
      const size_t n = std::min<size_t>(kRecordBytes, op.plain[0].iov_len);
      if (used + n + crypto::kTagBytes > op.stage.size()) break;
      NANOCCL_CHECK(op.aead->seal(op.plain[0].iov_base, n, stage + used));
      used += n + crypto::kTagBytes;
      advanceIov(op.plain, op.plainCnt, n);
    }
  }
  op.iov[0] = {stage, used};
  op.iovcnt = 1;
  op.left = used;
  return Status::ok();
}

bool IoEngine::openRecord(Op& op) {
  Status st = op.aead->open(op.stage.data(), op.record, op.plain[0].iov_base);
  if (!st.isOk()) {
    finish(op, -EBADMSG, std::move(st));
    return false;
  }
  advanceIov(op.plain, op.plainCnt, op.record);
  return true;
}

void IoEngine::sendNow(int fd, const iovec* iov, int iovcnt) {
  Op& op = sockets_.at(fd)->send;
  // (An abort frame's header and text fit a sealed socket's stage.)
  if (op.active || !load(op, iov, iovcnt).isOk()) return;
  msghdr m{};
  m.msg_iov = op.iov;
  m.msg_iovlen = static_cast<size_t>(op.iovcnt);
  [[maybe_unused]] ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
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

void IoEngine::finish(Op& op, int64_t result, Status error) {
  op.active = false;
  ready_.push_back({op.cookie, op.kind == Op::kSend, result, std::move(error)});
}

bool IoEngine::advance(Op& op, size_t n) {
  op.left -= n;
  advanceIov(op.iov, op.iovcnt, n);
  if (op.left > 0) return false;
  if (op.aead && op.kind == Op::kRecv && !openRecord(op)) return true;
  if (op.aead && op.plainCnt > 0) {
    Status st = nextRecords(op);
    if (st.isOk()) return false;
    finish(op, -EPROTO, std::move(st));
    return true;
  }
  finish(op, static_cast<int64_t>(op.total));
  return true;
}

}  // namespace nanoccl::tcp
