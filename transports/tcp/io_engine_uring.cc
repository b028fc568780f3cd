// The io_uring engine: one ring per progress thread; receives and sends are submitted as
// IORING_OP_RECV / IORING_OP_SENDMSG with MSG_WAITALL (the kernel retries short transfers;
// the engine resubmits the rest if one still comes back short, and a sealed socket's next
// records once the previous ones are through); completions are reaped in batches and marked
// seen with one io_uring_cq_advance. wakeup() writes an eventfd that has a
// read always pending on the ring.
#include "transports/tcp/io_engine.h"

#ifdef NANOCCL_HAVE_URING

#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

namespace nanoccl::tcp {
namespace {

constexpr unsigned kRingEntries = 256;

class UringEngine : public IoEngine {
 public:
  ~UringEngine() override {
    if (ringReady_) io_uring_queue_exit(&ring_);
  }

  Status init() {
    const int rc = io_uring_queue_init(kRingEntries, &ring_, 0);
    if (rc < 0) return systemError("io_uring_queue_init", -rc);
    ringReady_ = true;
    NANOCCL_CHECK(openWakeFd(0));
    wakeOp_.kind = Op::kWake;
    armWake();
    return Status::ok();
  }

  const char* name() const override { return "uring"; }

 private:
  void start(Op& op) override { submit(op); }

  Status reap(int timeoutMs) override {
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec ts{};
    ts.tv_sec = timeoutMs / 1000;
    ts.tv_nsec = static_cast<long long>(timeoutMs % 1000) * 1000000;
    const bool wait = timeoutMs != 0;
    int rc = io_uring_submit_and_wait_timeout(&ring_, &cqe, wait ? 1 : 0,
                                              timeoutMs < 0 || !wait ? nullptr : &ts, nullptr);
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      return systemError("io_uring_submit_and_wait_timeout", -rc);
    }
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      onCqe(static_cast<Op*>(io_uring_cqe_get_data(cqe)), cqe->res);
    }
    io_uring_cq_advance(&ring_, seen);
    return Status::ok();
  }

  io_uring_sqe* getSqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {  // submission queue full: hand it to the kernel and retry
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  void submit(Op& op) {
    io_uring_sqe* sqe = getSqe();
    if (op.kind == Op::kRecv) {
      io_uring_prep_recv(sqe, op.fd, op.iov[0].iov_base, op.iov[0].iov_len, MSG_WAITALL);
    } else {
      op.msg = msghdr{};
      op.msg.msg_iov = op.iov;
      op.msg.msg_iovlen = static_cast<size_t>(op.iovcnt);
      io_uring_prep_sendmsg(sqe, op.fd, &op.msg, MSG_NOSIGNAL | MSG_WAITALL);
    }
    io_uring_sqe_set_data(sqe, &op);
  }

  void armWake() {
    io_uring_sqe* sqe = getSqe();
    io_uring_prep_read(sqe, wakeFd_, &wakeValue_, sizeof(wakeValue_), 0);
    io_uring_sqe_set_data(sqe, &wakeOp_);
  }

  void onCqe(Op* op, int res) {
    if (op == &wakeOp_) {
      armWake();
    } else if (res == -EINTR || res == -EAGAIN) {
      submit(*op);
    } else if (res < 0) {
      finish(*op, res);
    } else if (res == 0 && op->kind == Op::kRecv) {
      finish(*op, 0);  // end of stream
    } else if (!advance(*op, static_cast<size_t>(res))) {
      submit(*op);
    }
  }

  io_uring ring_{};
  bool ringReady_ = false;
  uint64_t wakeValue_ = 0;
  Op wakeOp_;
};

}  // namespace

Status probeUring() {
  io_uring ring;
  const int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) return systemError("io_uring_queue_init", -rc);
  Status st;
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  if (probe == nullptr) {
    st = unavailableError("io_uring: the kernel cannot report its supported operations");
  } else {
    for (const int opcode : {IORING_OP_RECV, IORING_OP_SENDMSG, IORING_OP_READ}) {
      if (!io_uring_opcode_supported(probe, opcode)) {
        st = unavailableError("io_uring: operation " + std::to_string(opcode) +
                              " not supported by this kernel");
        break;
      }
    }
    io_uring_free_probe(probe);
  }
  io_uring_queue_exit(&ring);
  return st;
}

Result<std::unique_ptr<IoEngine>> createUringEngine() {
  NANOCCL_CHECK(probeUring());
  auto engine = std::make_unique<UringEngine>();
  NANOCCL_CHECK(engine->init());
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace nanoccl::tcp

#else  // !NANOCCL_HAVE_URING

namespace nanoccl::tcp {

Status probeUring() { return unavailableError("nanoccl was built without liburing"); }

Result<std::unique_ptr<IoEngine>> createUringEngine() { return probeUring(); }

}  // namespace nanoccl::tcp

#endif
