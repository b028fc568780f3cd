// The shared-memory transport: ranks of one host exchange messages through POSIX shared
// memory instead of sockets, with the same semantics as the tcp transport (transport.h).
//
// Setup: listen() creates this rank's segment (segment.h) and returns its name as the address;
// connect() maps every peer's segment, checks it was made with this job's secret and
// communicator, waits (under the deadline) until every peer has mapped this rank's segment,
// then unlinks the name: after connect() nothing is left in /dev/shm, even if the job is
// killed later. A rank whose connect() fails marks its segment aborted, so peers fail fast
// with its reason instead of waiting for the deadline.
//
// Threads: isend/irecv/abort/counters may be called from any thread. The transport is a
// drivable Mover under the transports' Engine (transports/engine.h): the rings and the
// matching tables belong to whoever holds the engine's progress: its progress thread; a thread
// that posts a send or receive while no one else holds it (it runs the command itself, instead
// of queueing it for the progress thread); or a thread waiting on a request, which runs the
// progress steps itself for up to NANOCCL_SPIN_US before it sleeps. Requests complete (and
// run their callbacks) on that thread. The progress thread never spins for long: after a few
// microseconds without work (NANOCCL_SPIN_US, yielding its core, while a request is pending or
// up to that long after it last moved a chunk: common/spin.h) it sleeps on a futex (its
// segment's doorbell), which peers ring after publishing a chunk (or freeing one for a sender
// that found its ring full), and which isend/irecv ring after queueing a command and a waiter
// rings when it stops driving with work left. It wakes at least every 100 ms to check its
// peers are alive.
//
// Messages: each ordered pair of ranks has one ring (in the receiver's segment) of kRingChunks
// chunks of kChunkBytes; a message streams through it chunk by chunk, each chunk carrying a
// FrameHeader (offset, length, fingerprint), so its size is unbounded. A send completes
// once its last chunk is in the ring (it never waits for the receive to be posted). The
// receiver copies each chunk out at once: into the caller's buffer when the receive is posted,
// else into a held buffer of the announced size, copied out when the receive comes.
//
// The board (board(), transport.h: Board): a ShmBoard (board.h) over two slots at the end of
// every segment; its rounds need no progress thread, ring or matching table. isend/irecv of
// a collective record the call in this rank's segment header (messageCall), so a peer
// waiting for that call on the board knows the ranks disagree.
//
// Failure: a mismatch, protocol violation or abort() fails the whole transport and marks this
// rank's segment aborted with the reason, which peers read on their next wake-up (they are
// rung). A peer whose segment says closed (its transport was destroyed) is drained, then
// fails the transport like a closed tcp connection; a peer process that died (gone, zombie,
// or its pid reused) is found within 100 ms. abort() returns once no copy touches a caller's
// buffer: copies happen only on the progress thread, between commands.
#pragma once

#include <memory>

#include "transports/transport.h"

namespace nanoccl::shm {

// Called by createTransport() (transport.h), which has checked the rank and size.
Result<std::unique_ptr<Transport>> createShmTransport(const TransportOptions& options);

}  // namespace nanoccl::shm
