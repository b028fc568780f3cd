// The libfabric transport: one FI_EP_RDM endpoint per rank, tagged messages (fi_tsendmsg /
// fi_trecv), the same contract as tcp and shm (transport.h) on the shared Matcher.
//
// Provider: FI_PROVIDER when set (verbs, efa, ... where the provider needs no registered
// memory), else "tcp;ofi_rxm" (RDM over TCP, what Debian's libfabric gives). With a TCP-based
// provider the endpoint binds to the interface NANOCCL_SOCKET_IFNAME picks. No provider that
// fits is an error naming FI_PROVIDER, never a silent fall-back to the tcp transport. The
// provider, its version and fabric are logged once at NANOCCL_DEBUG=INFO.
//
// Setup: listen() opens the endpoint and returns "fabric:<endpoint name>:<nonce>" (hex) as the
// address; connect() inserts every peer's name into the address vector, then greets every peer
// with a frame (its token proves the job secret, its size says this rank's frame size) and
// waits until every peer's greeting has come (the engine's roll, Engine::awaitPeers): an RDM
// endpoint has no connection handshake of its own.
//
// Who may send: every frame starts with a 16-byte token, a member's MAC (transports/identity.h:
// the job secret and comm id) over (sender, receiver, both ranks' nonces from the store). Only a
// holder of the job secret can make it; a frame whose token does not check out (a stranger,
// garbage, another job) is dropped before anything in it is read, and counted (logged once per
// transport); it never fails the job. Like the tcp transport without NANOCCL_ENCRYPT, it does not
// stop an on-path attacker who reads the token off the wire; NANOCCL_ENCRYPT=1 is refused here.
//
// Messages: a message travels as frames that fit ofi_rxm's eager size, FI_OFI_RXM_BUFFER_SIZE (64
// KiB unless the user set it: the first fabric transport of a process sets it, and rxm's receive
// buffers per connection, FI_OFI_RXM_MSG_RX_SIZE=32, where unset), a FrameHeader per frame, the
// payload sent straight from the caller's buffer. Ranks greet each other with their frame size,
// and must agree on it. The receiver keeps kRecvBuffers bounce buffers posted; each arriving frame
// is checked, copied to the receive (or the held early message, through the Matcher) and its
// buffer reposted at once. Frames of one sender are numbered and handled in sending order (a frame
// that completes early waits in a copy), so a peer's frames form one ordered lane, as in shm.
//
// Failure: abort() and a destroyed transport with work pending send an abort frame with the
// reason to every peer; a transport destroyed idle sends a close frame (what it sent before
// stays receivable, like a tcp connection closed in order), which a peer answers with its own
// once it has handled everything before it, and waits for those answers (at most kCloseBound:
// a completed send may still sit in the provider's queues, which closing the endpoint drops;
// a peer that is gone does not answer). A send the provider fails
// (fi_cq_readerr: a peer that died, unreachable) fails the transport naming the peer; while
// requests are pending, each peer is pinged every kPingPeriod so that a dead peer is found
// even by a rank that only receives from it.
#pragma once

#include <memory>

#include "transports/transport.h"

namespace nanoccl::fabric {

// Called by createTransport() (transport.h), which has checked the rank and size.
Result<std::unique_ptr<Transport>> createFabricTransport(const TransportOptions& options);

}  // namespace nanoccl::fabric
