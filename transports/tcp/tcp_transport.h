// The TCP transport: a full mesh of NANOCCL_NSOCKS connections per peer, a Mover (its sockets
// on an IoEngine: io_uring or epoll) under the transports' Engine (transports/engine.h).
//
// Threads: isend/irecv/abort/counters may be called from any thread; the Engine hands them to
// its progress thread, which alone touches sockets, the IoEngine and the matching tables.
// Requests complete (and run their callbacks) on the progress thread. While a request is
// pending, and up to NANOCCL_SPIN_US after the last command or completion, the progress
// thread polls the engine without sleeping (yielding its core; common/spin.h); otherwise it
// sleeps in the engine until a completion or a command comes.
//
// Messages: a message of at least stripeMinBytes is cut into one stripe per connection (each
// a frame: header + payload); smaller messages travel whole on one connection chosen from
// (seq, tag), point-to-point messages always on connection 0, so each peer's p2p messages
// stay in order. A frame whose receive is posted lands directly in the caller's buffer; one
// that arrives first is held in a buffer of the announced size (bounded by kMaxMessageBytes
// and checked before allocation) and copied out when the receive is posted.
//
// Encryption (NANOCCL_ENCRYPT=1): the connections are the IoEngine's sealed sockets (the
// header one AES-256-GCM record, the payload records of at most 256 KiB: io_engine.h); the
// keys come from the handshake (one per connection and direction), the nonces from a record
// counter. The transport sends and receives frames alike either way; a record that does not
// open fails the transport like any protocol violation.
//
// Failure: any broken connection, protocol violation, mismatch, or abort() fails the whole
// transport (see transport.h). The peers learn why from an abort frame where a connection is
// idle enough to carry one, and from the connections closing otherwise. abort() returns only
// once no socket operation still targets a caller's buffer.
#pragma once

#include <memory>
#include <string>

#include "transports/transport.h"

namespace nanoccl::tcp {

// Called by createTransport() (transport.h), which has checked the rank and size.
Result<std::unique_ptr<Transport>> createTcpTransport(const TransportOptions& options);

}  // namespace nanoccl::tcp
