// The routed transport: one Transport over two, so that the ranks of one node exchange their
// collective messages through shared memory while everything else goes over the network.
//
// Routing
// - The "remote" transport (tcp) connects every rank of the communicator, numbered as here.
//   The "local" transport (shm) connects this rank's node, numbered by local rank:
//   RouteOptions::localRanks[i] is the rank here of local rank i.
// - A collective message (fingerprint.op != kSendRecv) to or from a rank of this node goes
//   through the local transport; every other message through the remote one.
// - Point-to-point messages (kSendRecv) always take the remote transport, also between ranks of
//   one node: a kAnySource receive takes the first message from whichever peer, and a receive
//   posted on both transports could not be withdrawn from the one that loses the race (no
//   request can be cancelled); and FIFO order per (peer, tag) holds only within one transport.
//   Collectives carry almost all the bytes, so this costs little.
// - Matching, the mismatch check and the skipped-call check (transport.h) work unchanged, each
//   inside the inner transport: every collective message between two ranks takes the same
//   inner transport, so "a later call arrived on the way this message must take" still holds.
//
// Addresses: listen() returns "<remote address>|<local address>" ('|' occurs neither in a
// tcp address nor in a shm segment name, and listen() checks it). connect() hands every rank's
// remote part to the remote transport and the local parts of this node's ranks to the local one.
// With RouteOptions::fallback, a rank whose local transport is unavailable publishes the local
// part kNoLocalAddress, and every rank of its node then leaves the local transport unused.
// A rank of this node whose address has no local part does not route (its
// NANOCCL_INTRA_TRANSPORT differs): that is kMismatch at setup, not collective messages waiting
// on a transport their sender does not use. Ranks of other nodes may publish a plain address
// (they do not route); they read ours through plainAddresses().
//
// board(): the local transport's Board where every rank of the communicator is on this node
// (the numbering is then the same); null otherwise (the board's rounds need every rank).
//
// Requests name ranks as here: source() is this communicator's rank, and errors of the local
// transport are prefixed with its numbering where it differs from this one.
//
// Failure: when either inner transport fails (a request completes with an error other than
// kInvalidArgument), the routed transport aborts the other with the same reason, so it fails as
// a whole, as transport.h requires; the abort runs on a helper thread because inner callbacks
// must not block. abort() aborts both at once.
//
// Threads: as transport.h. isend/irecv/abort/counters from any thread; requests complete (and
// run their callbacks) on the inner transports' progress threads. The destructor joins the
// helper thread, then destroys both inner transports (which fail what is pending).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transports/transport.h"

namespace nanoccl::routed {

// Separates the two inner addresses in the published one.
constexpr char kAddressSeparator = '|';
// The local part of a rank whose local transport could not be set up (RouteOptions::fallback).
constexpr const char* kNoLocalAddress = "-";

struct RouteOptions {
  // The ranks of this rank's node, ascending, this rank included (at least one).
  std::vector<int> localRanks;
  std::string remote = "tcp";  // transport table names
  std::string local = "shm";
  // Where some rank of this node cannot set up its local transport (kUnavailable from listen(),
  // e.g. /dev/shm too small): true sends that node's collectives over the remote transport
  // instead (every rank of the node sees it in the addresses and decides alike); false fails.
  bool fallback = false;
};

class RoutedTransport : public Transport {
 public:
  // Payload per inner transport, per rank (index = rank here), under its table name:
  // {remote name, ...}, {local name, ...}. counters() is their sum.
  virtual std::vector<std::pair<std::string, std::vector<PeerCounters>>> countersPerTransport()
      const = 0;
};

// For a rank whose own transport does not route (alone on its node, or
// NANOCCL_INTRA_TRANSPORT=tcp): the published `addresses` reduced to their remote parts.
// kMismatch if a rank of this node (`localRanks`) routes: it would send its collectives
// through a transport this rank does not have.
Result<std::vector<std::string>> plainAddresses(const std::vector<std::string>& addresses, int rank,
                                                const std::vector<int>& localRanks);

// The local transport's options: this rank's local rank and the node's size, its own comm id.
TransportOptions localTransportOptions(const TransportOptions& options, const RouteOptions& route);

// Creates both inner transports from the transport table (kUnavailable where one is not built
// in). kInvalidArgument if localRanks is not an ascending list of ranks holding options.rank.
Result<std::unique_ptr<RoutedTransport>> createRoutedTransport(const TransportOptions& options,
                                                               const RouteOptions& route);

// Over inner transports made by the caller, not yet listening: `remote` with `options`,
// `local` with localTransportOptions(options, route).
Result<std::unique_ptr<RoutedTransport>> createRoutedTransport(const TransportOptions& options,
                                                               const RouteOptions& route,
                                                               std::unique_ptr<Transport> remote,
                                                               std::unique_ptr<Transport> local);

}  // namespace nanoccl::routed
