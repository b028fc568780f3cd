// Connection setup for the TCP transport: the listening socket and the full mesh.
//
// Rank r connects nsocks times to every rank below it and accepts nsocks connections from
// every rank above it, spread over its rails (network interfaces: connection s goes from rail
// s % rails to the peer's address on the same rail), all in one poll() loop on the calling
// thread (no helper threads). A connection is admitted only after both sides proved they hold
// the job key by challenge-response over fresh nonces (wire.h), and the communicator id
// matches: a stranger, garbage, a replayed handshake, or a connection that says nothing is
// closed (logged) and setup goes on; a member of the job whose settings differ (nsocks, stripe
// size, size, encryption) fails setup with an error that names both ranks' values. Nothing
// read from an unauthenticated connection is used to size an allocation.
#pragma once

#include <string>
#include <vector>

#include "common/crypto.h"
#include "common/deadline.h"
#include "common/status.h"
#include "transports/identity.h"
#include "transports/tcp/address.h"

namespace nanoccl::tcp {

// A listening socket on one rail (one network interface).
struct Listener {
  int fd = -1;
  std::string ifname;
  SocketAddress address;  // with the port the kernel chose
};

// Opens a non-blocking listening socket on `iface`.
Result<Listener> openListener(const InterfaceAddress& iface);

// One listening socket per rail chosen by `ifnameSpec` (pickRails(); closed again on failure).
// A rank publishes formatRails() of their addresses.
Result<std::vector<Listener>> openListeners(const std::string& ifnameSpec);

struct MeshParams {
  CommIdentity identity;  // the job secret and comm id every peer must prove
  int rank = 0;
  int size = 1;
  // Connections a peer, over all rails: connection s runs on rail s % rails (the listeners
  // this rank has; every rank must have as many).
  int nsocks = 1;
  uint64_t stripeMinBytes = 0;
  bool encrypt = false;  // must agree on every rank
  // TCP_CONGESTION of every connection (NANOCCL_TCP_CONGESTION); empty: the host's default.
  std::string tcpCongestion;
};

// Sets `fd`'s TCP congestion control to `name` (TCP_CONGESTION); an error naming
// NANOCCL_TCP_CONGESTION and the algorithms this host allows where the kernel refuses it.
Status setCongestionControl(int fd, const std::string& name);

// One connection of the mesh and the keys this rank seals (tx) and opens (rx) records with.
struct MeshLink {
  int fd = -1;
  crypto::Key txKey{};
  crypto::Key rxKey{};
};

// Builds the mesh; returns links[peer][socketIndex] (connected, non-blocking, TCP_NODELAY;
// links[rank] is empty). `addresses` are every rank's formatRails(); ranks with different
// rail counts fail here, on every rank, naming them. Closes everything it opened on failure.
Result<std::vector<std::vector<MeshLink>>> buildMesh(const std::vector<Listener>& listeners,
                                                     const std::vector<std::string>& addresses,
                                                     const MeshParams& params,
                                                     const Deadline& deadline);

}  // namespace nanoccl::tcp
