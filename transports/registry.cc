// The transport table (docs/design.md, convention 3): adding a transport is a folder, a CMake option and
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
#ifdef NANOCCL_HAVE_FABRIC
#include "transports/fabric/fabric_transport.h"
#endif

namespace nanoccl {
namespace {

using CreateFn = Result<std::unique_ptr<Transport>> (*)(const TransportOptions&);

// Every transport this source tree knows; `create` is null where the build left it out, and
// `needs` says what building it takes.
struct TransportRow {
  const char* name;
  const char* description;
  TransportScope scope;
  const char* needs;
  CreateFn create;
};

constexpr TransportRow kTransports[] = {
    {"tcp", "TCP sockets between hosts, on io_uring or epoll", TransportScope::kInterNode,
     "always built",
#ifdef NANOCCL_HAVE_TCP
     tcp::createTcpTransport},
#else
     nullptr},
#endif
    {"fabric", "libfabric RDM endpoints between hosts (FI_PROVIDER, default tcp;ofi_rxm)",
     TransportScope::kInterNode, "libfabric (libfabric-dev) and NANOCCL_WITH_FABRIC=AUTO|ON",
#ifdef NANOCCL_HAVE_FABRIC
     fabric::createFabricTransport},
#else
     nullptr},
#endif
    {"shm", "POSIX shared memory between ranks of one host", TransportScope::kIntraNode,
     "Linux",
#ifdef NANOCCL_HAVE_SHM
     shm::createShmTransport},
#else
     nullptr},
#endif
};

const TransportRow* findRow(const std::string& name) {
  for (const TransportRow& row : kTransports) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

// "a, b, c": the rows built in with this scope.
std::string builtNames(TransportScope scope, const std::string& first = "") {
  std::string out = first;
  for (const TransportRow& row : kTransports) {
    if (row.create == nullptr || row.scope != scope) continue;
    out += std::string(out.empty() ? "" : ", ") + row.name;
  }
  return out;
}

// The row `setting` names for a transport of `scope` (kIntraNode: any row, every transport
// works within a node), as a Status naming the setting if it cannot be that.
Result<std::string> resolve(const std::string& setting, const std::string& value,
                            TransportScope scope) {
  std::string choices = builtNames(scope, "auto");
  if (scope == TransportScope::kIntraNode) {
    choices = builtNames(TransportScope::kInterNode, choices);
  }
  const TransportRow* row = findRow(value);
  if (row == nullptr) {
    return invalidArgument(setting + "=" + value + ": no such transport (choose one of: " +
                           choices + ")");
  }
  if (row->create == nullptr) {
    return unavailableError(setting + "=" + value + ": the " + value +
                            " transport is not built into this library (it needs " + row->needs +
                            "; built: " + choices + ")");
  }
  if (row->scope != scope && scope == TransportScope::kInterNode) {
    return invalidArgument(setting + "=" + value + ": " + value + " (" + row->description +
                           ") cannot carry messages between nodes (choose one of: " + choices +
                           ")");
  }
  return std::string(row->name);
}

}  // namespace

std::vector<TransportInfo> builtInTransports() {
  std::vector<TransportInfo> out;
  for (const TransportRow& row : kTransports) {
    if (row.create != nullptr) out.push_back({row.name, row.description, row.scope});
  }
  return out;
}

Result<std::unique_ptr<Transport>> createTransport(const std::string& name,
                                                   const TransportOptions& options) {
  const TransportRow* row = findRow(name);
  if (row != nullptr && row->create != nullptr) {
    if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
      return invalidArgument(name + " transport: rank " + std::to_string(options.rank) +
                             " outside a communicator of size " + std::to_string(options.size));
    }
    return row->create(options);
  }
  std::string known;
  for (const TransportInfo& t : builtInTransports()) {
    known += std::string(known.empty() ? "" : ", ") + t.name;
  }
  return unavailableError("transport '" + name + "' is not built in (available: " + known + ")");
}

Result<TransportChoice> chooseTransports(const Config& config) {
  TransportChoice c;
  if (config.transport == "auto") {
    const std::string built = builtNames(TransportScope::kInterNode);
    if (built.empty()) return unavailableError("no inter-node transport is built in");
    c.interNode = built.substr(0, built.find(','));
  } else {
    NANOCCL_ASSIGN_OR_RETURN(
        c.interNode, resolve("NANOCCL_TRANSPORT", config.transport, TransportScope::kInterNode));
  }
  // NANOCCL_INTRA_TRANSPORT: an intra-node row, or an inter-node one (then the node's ranks
  // talk over it like ranks of different nodes).
  const std::string& intra = config.intraTransport;
  if (intra == "auto") {
    const std::string built = builtNames(TransportScope::kIntraNode);
    c.intraNode = built.empty() ? c.interNode : built.substr(0, built.find(','));
    c.intraFallback = true;
  } else {
    NANOCCL_ASSIGN_OR_RETURN(c.intraNode,
                             resolve("NANOCCL_INTRA_TRANSPORT", intra, TransportScope::kIntraNode));
  }
  return c;
}

}  // namespace nanoccl
