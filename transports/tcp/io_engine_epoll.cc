// The epoll engine: edge-triggered readiness, non-blocking recv/sendmsg. Every post tries the
// transfer at once (data often is already there), so an edge that fired before the post is
// never lost.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "transports/tcp/io_engine.h"

namespace nanoccl::tcp {
namespace {

class EpollEngine : public IoEngine {
 public:
  ~EpollEngine() override {
    if (wakeFd_ >= 0) close(wakeFd_);
    if (epollFd_ >= 0) close(epollFd_);
  }

  Status init() {
    epollFd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epollFd_ < 0) return systemError("epoll_create1", errno);
    wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wakeFd_ < 0) return systemError("eventfd", errno);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wakeFd_;
    if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev) != 0) {
      return systemError("epoll_ctl(eventfd)", errno);
    }
    return Status::ok();
  }

  const char* name() const override { return "epoll"; }

  Status addSocket(int fd) override {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.fd = fd;
    if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) return systemError("epoll_ctl", errno);
    sockets_[fd] = Socket{};
    return Status::ok();
  }

  void removeSocket(int fd) override {
    epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr);
    sockets_.erase(fd);
  }

  Status postRecv(int fd, void* buf, size_t len, void* cookie) override {
    Socket& s = sockets_.at(fd);
    if (s.recv.active) return internalError("epoll engine: second receive posted on a socket");
    s.recv = Op{};
    s.recv.active = true;
    s.recv.iov[0] = {buf, len};
    s.recv.iovcnt = 1;
    s.recv.left = len;
    s.recv.total = len;
    s.recv.cookie = cookie;
    progressRecv(fd, s);
    return Status::ok();
  }

  Status postSend(int fd, const iovec* iov, int iovcnt, void* cookie) override {
    if (iovcnt < 1 || iovcnt > kMaxIov) return internalError("epoll engine: bad iovcnt");
    Socket& s = sockets_.at(fd);
    if (s.send.active) return internalError("epoll engine: second send posted on a socket");
    s.send = Op{};
    s.send.active = true;
    s.send.cookie = cookie;
    for (int i = 0; i < iovcnt; ++i) {
      if (iov[i].iov_len == 0) continue;
      s.send.iov[s.send.iovcnt++] = iov[i];
      s.send.left += iov[i].iov_len;
    }
    s.send.total = s.send.left;
    progressSend(fd, s);
    return Status::ok();
  }

  Status poll(int timeoutMs, const std::function<void(const IoCompletion&)>& fn) override {
    epoll_event events[64];
    const int n = epoll_wait(epollFd_, events, 64, ready_.empty() ? timeoutMs : 0);
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
      progressRecv(fd, it->second);
      progressSend(fd, it->second);
    }
    // Callbacks may post new operations (which may complete at once into ready_): swap first.
    std::vector<IoCompletion> batch;
    batch.swap(ready_);
    for (const auto& c : batch) fn(c);
    return Status::ok();
  }

  void wakeup() override {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t r = write(wakeFd_, &one, sizeof(one));
  }

 private:
  struct Op {
    bool active = false;
    iovec iov[kMaxIov];
    int iovcnt = 0;
    size_t left = 0;
    size_t total = 0;
    void* cookie = nullptr;
  };
  struct Socket {
    Op recv;
    Op send;
  };

  void finish(Op& op, int64_t result) {
    op.active = false;
    ready_.push_back({op.cookie, result});
  }

  static void advance(Op& op, size_t n) {
    op.left -= n;
    advanceIov(op.iov, op.iovcnt, n);
  }

  void progressRecv(int fd, Socket& s) {
    Op& op = s.recv;
    while (op.active && op.left > 0) {
      const ssize_t n = ::recv(fd, op.iov[0].iov_base, op.iov[0].iov_len, 0);
      if (n > 0) {
        advance(op, static_cast<size_t>(n));
      } else if (n == 0) {
        return finish(op, 0);
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return;
      } else {
        return finish(op, -errno);
      }
    }
    if (op.active) finish(op, static_cast<int64_t>(op.total));
  }

  void progressSend(int fd, Socket& s) {
    Op& op = s.send;
    while (op.active && op.left > 0) {
      msghdr msg{};
      msg.msg_iov = op.iov;
      msg.msg_iovlen = static_cast<size_t>(op.iovcnt);
      const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (n >= 0) {
        advance(op, static_cast<size_t>(n));
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return;
      } else {
        return finish(op, -errno);
      }
    }
    if (op.active) finish(op, static_cast<int64_t>(op.total));
  }

  int epollFd_ = -1;
  int wakeFd_ = -1;
  std::unordered_map<int, Socket> sockets_;
  std::vector<IoCompletion> ready_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> createEpollEngine() {
  auto engine = std::make_unique<EpollEngine>();
  NANOCCL_CHECK(engine->init());
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace nanoccl::tcp
