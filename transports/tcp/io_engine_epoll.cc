// The epoll engine: edge-triggered readiness, non-blocking recv/sendmsg. Every post tries the
// transfer at once (data often is already there), so an edge that fired before the post is
// never lost.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "transports/tcp/io_engine.h"

namespace nanoccl::tcp {
namespace {

class EpollEngine : public IoEngine {
 public:
  ~EpollEngine() override {
    if (epollFd_ >= 0) close(epollFd_);
  }

  Status init() {
    epollFd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epollFd_ < 0) return systemError("epoll_create1", errno);
    NANOCCL_CHECK(openWakeFd(EFD_NONBLOCK));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wakeFd_;
    if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev) != 0) {
      return systemError("epoll_ctl(eventfd)", errno);
    }
    return Status::ok();
  }

  const char* name() const override { return "epoll"; }

 private:
  Status watch(int fd) override {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.fd = fd;
    if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) return systemError("epoll_ctl", errno);
    return Status::ok();
  }

  void start(Op& op) override { transfer(op); }

  Status reap(int timeoutMs) override {
    epoll_event events[64];
    const int n = epoll_wait(epollFd_, events, 64, timeoutMs);
    if (n < 0 && errno != EINTR) return systemError("epoll_wait", errno);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wakeFd_) {
        uint64_t v;
        while (read(wakeFd_, &v, sizeof(v)) > 0) {
        }
        continue;
      }
      auto it = sockets_.find(fd);
      if (it == sockets_.end()) continue;
      transfer(it->second->recv);
      transfer(it->second->send);
    }
    return Status::ok();
  }

  // Moves what the socket takes now: until the transfer is done, the socket would block, or an
  // error (end of stream, for a receive).
  void transfer(Op& op) {
    while (op.active) {
      ssize_t n;
      if (op.kind == Op::kRecv) {
        n = ::recv(op.fd, op.iov[0].iov_base, op.iov[0].iov_len, 0);
        if (n == 0) return finish(op, 0);
      } else {
        msghdr msg{};
        msg.msg_iov = op.iov;
        msg.msg_iovlen = static_cast<size_t>(op.iovcnt);
        n = ::sendmsg(op.fd, &msg, MSG_NOSIGNAL);
      }
      if (n >= 0) {
        advance(op, static_cast<size_t>(n));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return;
      } else if (errno != EINTR) {
        return finish(op, -errno);
      }
    }
  }

  int epollFd_ = -1;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> createEpollEngine() {
  auto engine = std::make_unique<EpollEngine>();
  NANOCCL_CHECK(engine->init());
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace nanoccl::tcp
