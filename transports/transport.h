// Transport / Request: how bytes move between the ranks of one communicator.
//
// Ownership and threads
// - A Transport belongs to one communicator and connects it to every peer (full mesh). It owns
//   its sockets and its progress thread; the destructor aborts what is pending and joins it.
// - isend/irecv may be called from any thread; requests complete on the progress thread, or
//   on a thread that drives progress while it waits (Request::wait).
//   The caller keeps the buffer alive and untouched until the request completes (or the
//   transport is aborted and destroyed).
// - Any number of requests may be pending per peer. Sends never wait for the matching receive
//   to be posted: a message that arrives before its receive is held by the receiver (an
//   "unexpected" message) and copied out when the receive is posted.
//
// Matching
// - Collective messages (fingerprint.op != kSendRecv) match on (peer, fingerprint.seq, tag).
//   The receiver then checks the sender's fingerprint against its own and the length against
//   the posted size; any difference fails the receive with kMismatch naming both ranks and
//   both calls. A receive whose sender has visibly moved past its sequence number (a later
//   call arrived on the connection the message must use) also fails with kMismatch.
// - Point-to-point messages (fingerprint.op == kSendRecv) match on (peer, tag) in the order
//   they were sent; irecv with peer == kAnySource takes the first such message from any peer.
//
// Failure
// - A peer whose connection breaks fails every pending and later request to or from it with
//   kPeerError. abort(why) fails everything pending locally with `why` and tells every peer,
//   whose transports then fail their own pending requests with kPeerError quoting `why`.
//   After either, the transport stays failed: later requests complete at once with the error.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/deadline.h"
#include "common/op.h"
#include "common/status.h"

namespace nanoccl {

constexpr int kAnySource = -1;

// Identifies a message: the call it belongs to and its step (tag) within that call.
struct Envelope {
  OpFingerprint fingerprint;
  uint32_t tag = 0;
};

// One pending send or receive.
class Request {
 public:
  virtual ~Request() = default;
  // True once the request has completed, successfully or not. Never blocks.
  virtual bool test() = 0;
  // Blocks until completion or the deadline. On kTimeout the request is still pending: the
  // caller must abort the transport before it releases the buffer. It may first poll, or run
  // the transport's progress on the calling thread (shm), for up to NANOCCL_SPIN_US
  // (common/spin.h); it must not race with the transport's destruction.
  virtual Status wait(const Deadline& deadline) = 0;
  // After a successful receive: the rank the message came from (useful with kAnySource).
  virtual int source() const = 0;
  // Runs `cb(status, source)` once when the request completes: on the progress thread, or at
  // once on the calling thread if it already has. `cb` must not block. Set it at most once.
  virtual void setCallback(std::function<void(const Status&, int source)> cb) = 0;
};

// Board: an optional capability of a transport whose ranks all share memory (shm): one
// round is an allgather of small messages in place. Every rank publishes one message (at most
// capacity() bytes, possibly empty) and gets a view of every rank's message of the same round.
// Small collectives run on it in one round, driven by the calling thread alone: no progress
// thread, no matching tables, no per-peer messages (transports/shm/board.h has the layout).
//
// Contract
// - Every rank of the transport takes part in every round, in the same order (rounds are
//   numbered by the board itself); a round's fingerprint must be the same on every rank.
//   A different one is kMismatch naming both ranks and both calls.
// - One thread at a time per transport (the thread running the communicator's current call).
// - Views stay valid and unchanged until this rank's next exchange(): a peer cannot publish
//   two rounds ahead of any rank.
// - A peer that died, closed or aborted its transport is kPeerError; abort() of this
//   transport is its reason; the deadline is kTimeout naming the ranks not yet published.
//   After an error the transport must be aborted (the communicator does): its rounds are
//   out of step.
// What one rank may publish in a round of the shm transport's board: calls up to this size
// run on it (collectives/board.cc).
constexpr size_t kBoardMessageBytes = size_t{64} << 10;

class Board {
 public:
  virtual ~Board() = default;
  // Bytes one rank may publish in a round.
  virtual size_t capacity() const = 0;
  // Publishes `bytes` of `data` as this rank's message of the next round, under `fp`, and
  // waits until every rank has published that round. On success views[r] / sizes[r] hold
  // rank r's message (this rank's own included).
  virtual Status exchange(const OpFingerprint& fp, const void* data, size_t bytes,
                          const Deadline& deadline, std::vector<const char*>& views,
                          std::vector<size_t>& sizes) = 0;
};

struct PeerCounters {
  uint64_t bytesSent = 0;  // payload bytes, frame headers not included
  uint64_t bytesReceived = 0;
  uint64_t messagesSent = 0;
  uint64_t messagesReceived = 0;
  // Connections this peer closed in order (it finished and left): what it sent before stays
  // receivable. Tests use it to know that the close has been seen.
  uint64_t connectionsClosed = 0;

  PeerCounters& operator+=(const PeerCounters& c) {
    bytesSent += c.bytesSent;
    bytesReceived += c.bytesReceived;
    messagesSent += c.messagesSent;
    messagesReceived += c.messagesReceived;
    connectionsClosed += c.connectionsClosed;
    return *this;
  }
};

struct TransportOptions {
  int rank = 0;
  int size = 1;
  std::string commId;  // unique per communicator within the job; checked in the handshake
  std::string secret;  // the job's secret (common/secret.h); peers prove it, never send it
  Config config;
};

// Payload bytes a transport moved over one network interface (a rail: tcp's NICs).
struct RailCounters {
  std::string ifname;
  uint64_t bytesSent = 0;
  uint64_t bytesReceived = 0;
};

// Adds `from` to `into`, interface by interface (new ones appended in order).
inline void addRails(std::vector<RailCounters>& into, const std::vector<RailCounters>& from) {
  for (const RailCounters& r : from) {
    auto it = std::find_if(into.begin(), into.end(),
                           [&](const RailCounters& x) { return x.ifname == r.ifname; });
    if (it == into.end()) it = into.insert(into.end(), RailCounters{r.ifname});
    it->bytesSent += r.bytesSent;
    it->bytesReceived += r.bytesReceived;
  }
}

class Transport {
 public:
  virtual ~Transport() = default;

  // Connection setup, in two phases around the store exchange done by the communicator:
  // listen() opens this rank's listening sockets and returns the address to publish;
  // connect() builds the full mesh from every rank's published address (index = rank).
  // Connections that do not prove the secret, or bring another comm id or an invalid rank, are
  // closed before any payload is read, and setup goes on.
  virtual Result<std::string> listen() = 0;
  virtual Status connect(const std::vector<std::string>& addresses, const Deadline& deadline) = 0;

  virtual std::shared_ptr<Request> isend(int peer, const Envelope& env, const void* buf,
                                         size_t bytes) = 0;
  virtual std::shared_ptr<Request> irecv(int peer, const Envelope& env, void* buf,
                                         size_t bytes) = 0;

  // Fails all pending requests with `why` and tells the peers. Idempotent; thread-safe.
  // Returns once no socket, copy or provider operation targets a caller's buffer; where that
  // does not happen within a few seconds (a stuck progress thread) it says so in the log and
  // returns, and the requests whose buffers may still be targeted stay pending (not failed)
  // until they are released, so that their waiters do not free them early.
  virtual void abort(const Status& why) = 0;

  // Payload bytes and messages per peer (index = rank) since creation.
  virtual std::vector<PeerCounters> counters() const = 0;
  // Payload bytes per network interface, for transports that know theirs (tcp, one entry a
  // rail); empty for the others.
  virtual std::vector<RailCounters> railCounters() const { return {}; }

  // "tcp/uring x2" etc., for logs and stats.
  virtual std::string describe() const = 0;

  // For a call that timed out waiting on `peer`: what the transport sees stuck on its way
  // there ("connection 1 to rank 0 on eth1: 2.1 MB not acknowledged for 14.8 s", or "...: eth1
  // is down here"), or "" where it sees nothing (or cannot tell). Thread-safe.
  virtual std::string stallReport(int peer) const { return ""; }

  // The transport's Board where every rank of it shares this host's memory and it is
  // connected (shm; routed where all ranks are on this node); null otherwise. Owned by the
  // transport. Wrappers that do not forward it leave their calls on messages.
  virtual Board* board() { return nullptr; }
};

// Creates a transport by name from the transport table ("tcp"). Unknown names and
// transports compiled out are kUnavailable.
Result<std::unique_ptr<Transport>> createTransport(const std::string& name,
                                                   const TransportOptions& options);

// Where a transport can carry messages.
enum class TransportScope {
  kIntraNode,  // between ranks of one host only (shm)
  kInterNode,  // between hosts (and within one, over loopback)
};

// One row of the transport table, as built into this library.
struct TransportInfo {
  std::string name;         // what NANOCCL_TRANSPORT and createTransport() take
  std::string description;  // one line, for errors and `nanoccl.stats()`
  TransportScope scope;
};

// Every transport built in, in table order.
std::vector<TransportInfo> builtInTransports();

// Which table rows a communicator uses, from its settings (every rank has the same table and
// settings, so every rank chooses alike).
struct TransportChoice {
  std::string interNode;  // NANOCCL_TRANSPORT: between nodes, and between all ranks
  std::string intraNode;  // NANOCCL_INTRA_TRANSPORT: collectives within a node
  // intraNode was "auto": a node where it cannot be set up stays on interNode.
  bool intraFallback = false;
};
// An unknown name, a row not built in, or one whose scope does not fit the setting is an
// error naming the setting and the choices.
Result<TransportChoice> chooseTransports(const Config& config);

}  // namespace nanoccl
