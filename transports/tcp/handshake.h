// Connection setup for the TCP transport: the listening socket and the full mesh.
//
// Rank r connects nsocks times to every rank below it and accepts nsocks connections from
// every rank above it, spread over its rails (network interfaces: connection s goes from rail
// s % rails to the peer's address on the same rail), all in one poll() loop on the calling
// thread (no helper threads). A connection is admitted only after both sides proved they hold
// the job key by challenge-response over fresh nonces (wire.h), and the communicator id
// matches: a stranger, garbage, a replayed handshake, or a connection that says nothing is
// closed (logged) and setup goes on. The settings every rank must share (size, nsocks, stripe
// size, encryption, rail count) are compared from the published addresses before any connection is
// made: a rank whose settings differ fails setup on every rank, with an error that names both
// ranks' values. Nothing read from an unauthenticated connection is used to size an allocation.
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
// A rank publishes formatRails() of their addresses, with the settings every rank must share.
Result<std::vector<Listener>> openListeners(const std::string& ifnameSpec);

struct MeshParams {
  CommIdentity identity;  // the job secret and comm id every peer must prove
  int rank = 0;
  int size = 1;
  // Connections a peer, over all rails: connection s runs on rail s % rails (the listeners
  // this rank has; every rank must have as many).
  int nsocks = 1;
  // TCP_CONGESTION of every connection this rank makes (chooseCongestionControl's answer);
  // empty: the host's default.
  std::string tcpCongestion{};
};

// Sets `fd`'s TCP congestion control to `name` (TCP_CONGESTION); an error naming
// NANOCCL_TCP_CONGESTION and the algorithms this host allows where the kernel refuses it.
Status setCongestionControl(int fd, const std::string& name);

// The congestion control of this rank's connections, from NANOCCL_TCP_CONGESTION (`setting`):
// set on `fd` (a listener: the connections it accepts inherit it) and returned for the
// connections this rank makes (empty: leave them at the host's default).
//  - "host": the host's default, whatever it is.
//  - "auto": the host's default, unless that is BBR (any version): then cubic, or reno where
//    the kernel does not let this process set cubic (reno is always allowed). Measured on the
//    emulated 2x2 cluster at 1 Gbit/s (results/latency/README.md): under BBR, back-to-back
//    allreduces of 64-256 KiB stalled for 20-170 ms now and then (p99 53-60 ms against medians
//    of 1.1-2.2 ms, slower than Gloo at 256 KiB); under cubic or reno none did (p99 1.4-2.6 ms).
//  - a name: that algorithm, or the error of setCongestionControl.
Result<std::string> chooseCongestionControl(int fd, const std::string& setting);

// One connection of the mesh and the keys this rank seals (tx) and opens (rx) records with.
struct MeshLink {
  int fd = -1;
  crypto::Key txKey{};
  crypto::Key rxKey{};
};

// Builds the mesh; returns links[peer][socketIndex] (connected, non-blocking, TCP_NODELAY;
// links[rank] is empty). `addresses` are every rank's formatRails(), this rank's own at
// [rank]; ranks with different settings (publishedSettings()) or rail counts fail here, on
// every rank, naming both, before any connection. Closes everything it opened on failure.
Result<std::vector<std::vector<MeshLink>>> buildMesh(const std::vector<Listener>& listeners,
                                                     const std::vector<std::string>& addresses,
                                                     const MeshParams& params,
                                                     const Deadline& deadline);

}  // namespace nanoccl::tcp
