// Socket addresses and the choice of network interface.
//
// NANOCCL_SOCKET_IFNAME follows NCCL_SOCKET_IFNAME: a comma-separated list of interface name
// prefixes ("eth,ens"); a leading '^' excludes the listed prefixes instead ("^docker,lo"); a
// leading '=' (after any '^') makes the names exact ("=eth0", "^=docker0"). Empty: every
// interface that is up except loopback and docker*, falling back to loopback when nothing else
// has an address.
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace nanoccl::tcp {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  int family() const { return storage.ss_family; }
  // "10.0.0.1:4242" or "[fe80::1]:4242".
  std::string toString() const;
  static Result<SocketAddress> parse(const std::string& text);
  void setPort(uint16_t port);
};

struct InterfaceAddress {
  std::string name;  // "eth0"
  SocketAddress address;
};

// Whether interface `name` passes `spec` (NCCL syntax above; empty spec matches everything).
bool interfaceMatches(const std::string& name, const std::string& spec);

// The address to listen on for `spec`: the first matching interface that is up, IPv4 before
// IPv6. kUnavailable naming the interfaces seen when nothing matches.
Result<InterfaceAddress> pickInterface(const std::string& spec);

}  // namespace nanoccl::tcp
