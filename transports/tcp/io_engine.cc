// createEngine(): io_uring where the kernel allows it, else epoll (io_engine.h).
#include "transports/tcp/io_engine.h"

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

}  // namespace nanoccl::tcp
