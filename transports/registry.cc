// The transport table (shared/STYLE.md 3): adding a transport is a folder, a CMake option and
// one row here.
#include <string>
#include <vector>

#include "transports/transport.h"

#ifdef NANOCCL_HAVE_TCP
#include "transports/tcp/tcp_transport.h"
#endif
#ifdef NANOCCL_HAVE_SHM
#include "transports/shm/shm_transport.h"
#endif

namespace nanoccl {
namespace {

struct TransportRow {
  const char* name;
  const char* description;
  TransportScope scope;
  Result<std::unique_ptr<Transport>> (*create)(const TransportOptions&);
};

constexpr TransportRow kTransports[] = {
#ifdef NANOCCL_HAVE_TCP
    {"tcp", "TCP sockets between hosts, on io_uring or epoll", TransportScope::kInterNode,
     tcp::createTcpTransport},
#endif
#ifdef NANOCCL_HAVE_SHM
    {"shm", "POSIX shared memory between ranks of one host", TransportScope::kIntraNode,
     shm::createShmTransport},
#endif
};

}  // namespace

std::vector<TransportInfo> builtInTransports() {
  std::vector<TransportInfo> out;
  for (const TransportRow& row : kTransports) out.push_back({row.name, row.description, row.scope});
  return out;
}

Result<std::unique_ptr<Transport>> createTransport(const std::string& name,
                                                   const TransportOptions& options) {
  std::string known;
  for (const TransportRow& row : kTransports) {
    if (name == row.name) return row.create(options);
    known += std::string(known.empty() ? "" : ", ") + row.name;
  }
  return unavailableError("transport '" + name + "' is not built in (available: " + known + ")");
}

}  // namespace nanoccl
