// Socket addresses and the choice of network interface, for every transport that speaks IP
// (tcp's rails, fabric's endpoint) and for the store's address.
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

#include "common/config.h"
#include "common/status.h"

namespace nanoccl {

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
  bool running = true;  // IFF_RUNNING: up with a carrier (a cable, a peer veth)
};

// Whether interface `name` passes `spec` (NCCL syntax above; empty spec matches everything).
bool interfaceMatches(const std::string& name, const std::string& spec);

// The interfaces that are up, with their usable addresses (IPv4 first, then IPv6 that is not
// link-local), in getifaddrs() order.
Result<std::vector<InterfaceAddress>> upInterfaces();

// Rails: the interfaces the TCP transport spreads its connections over. A spec that lists
// interfaces to include (no leading '^') selects one rail per running interface it matches
// (aliases such as "eth0:1" are not interfaces of their own), in the order of its items
// ("eth1,eth0": eth1 is rail 0), interfaces one item matches in name order, each interface
// once with its first address (IPv4 before IPv6); rail k of every rank must be on the same
// network. An empty or excluding spec, or a list none of whose matches is running, selects one
// rail: the first matching interface that is up, IPv4 before IPv6 (without a spec, loopback
// and docker* only when nothing else is up). kUnavailable naming the interfaces seen when
// nothing matches. `seen` is upInterfaces() (a parameter for tests).
Result<std::vector<InterfaceAddress>> pickRails(const std::string& spec,
                                                const std::vector<InterfaceAddress>& seen);
// The same over this host's interfaces (upInterfaces()).
Result<std::vector<InterfaceAddress>> pickRails(const std::string& spec);

// The line rate the kernel reports for interface `name` (/sys/class/net/<name>/speed), in
// Mbit/s; 0 where it reports none (loopback, some virtual devices).
int64_t interfaceMbps(const std::string& name);

}  // namespace nanoccl
