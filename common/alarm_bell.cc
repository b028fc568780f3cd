#include "common/alarm_bell.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "common/logging.h"

namespace nanoccl {

namespace {

timespec toTimespec(Clock::duration d) {
  const int64_t ns =
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
  return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

void drain(int fd) {
  uint64_t n;
  while (::read(fd, &n, sizeof n) < 0 && errno == EINTR) {
  }
}

}  // namespace

AlarmBell::~AlarmBell() {
  if (ringFd_ >= 0) ::close(ringFd_);
  if (alarmFd_ >= 0) ::close(alarmFd_);
}

Status AlarmBell::open() {
  ringFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ringFd_ < 0) return systemError("eventfd", errno);
  alarmFd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (alarmFd_ < 0) return systemError("timerfd_create", errno);
  return Status();
}

void AlarmBell::ring() {
  const uint64_t one = 1;
  // Fails only where the counter would pass 2^64 - 2: it is non-zero then, rung already.
  while (::write(ringFd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void AlarmBell::setAlarm(Clock::time_point at) {
  // steady_clock is CLOCK_MONOTONIC: its epoch is the timer's. A zero it_value would disarm
  // the timer, so a time at or before the epoch is rounded up to a nanosecond after it.
  itimerspec spec{};
  spec.it_value = toTimespec(at.time_since_epoch());
  if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  if (::timerfd_settime(alarmFd_, TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
    // Only with a bad descriptor or time (neither comes from the communicator): the sleeper
    // would then wait for a ring, so say it.
    NANOCCL_WARN("alarm bell: timerfd_settime failed: " << std::strerror(errno));
  }
}

void AlarmBell::sleep(Clock::time_point until) {
  pollfd fds[2] = {{ringFd_, POLLIN, 0}, {alarmFd_, POLLIN, 0}};
  timespec left{};
  const timespec* timeout = nullptr;
  if (until != Clock::time_point::max()) {
    // Capped at an hour, which a caller's loop sleeps again, rather than overflow the sum.
    left = toTimespec(std::min<Clock::duration>(until - Clock::now(), std::chrono::hours(1)));
    timeout = &left;
  }
  if (::ppoll(fds, 2, timeout, nullptr) > 0) {
    if (fds[0].revents & POLLIN) drain(ringFd_);
    if (fds[1].revents & POLLIN) drain(alarmFd_);
  }
}

}  // namespace nanoccl
