// ShmBoard: the shm transport's Board (transport.h): one round of small messages between the
// ranks of one host, through the two BoardSlots at the end of every segment (segment.h).
//
// Ownership and threads
// - Owned by its ShmTransport, which connects it once every peer's segment is mapped
//   (connect(), before the transport says it is connected) and fails it with the transport
//   (fail(), from any thread).
// - exchange() is called by one thread at a time (the one running the communicator's current
//   call); it holds no lock of the transport and needs no progress thread: it publishes into
//   this rank's slot, rings the peers' board doorbells and polls their slots for
//   NANOCCL_SPIN_US (yielding), then sleeps on its own board doorbell, waking at least every
//   kLivenessPeriod to check its peers are alive.
// - A rank that posts a collective ring message records the call in its segment header
//   (SegmentHeader::messageCall, the transport's isend/irecv), so a peer waiting for that call
//   on the board knows the ranks disagree.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "transports/shm/segment.h"
#include "transports/transport.h"
#include "transports/engine.h"

namespace nanoccl::shm {

class ShmBoard : public Board {
 public:
  struct Peer {
    Segment* seg = nullptr;  // null for this rank's own entry
    ProcessIdentity identity;
  };

  // `counters`: the transport's, where published and read bytes count; it outlives the board.
  ShmBoard(int rank, int size, std::chrono::microseconds spin, TransportCounters& counters)
      : rank_(rank), size_(size), spin_(spin), me_("rank " + std::to_string(rank)),
        counters_(counters) {}

  // This rank's segment and every rank's (index = rank). Once, before the first exchange().
  void connect(Segment* own, std::vector<Peer> peers) {
    own_ = own;
    peers_ = std::move(peers);
  }

  // The transport failed: a pending exchange() returns `why` (its waiter is woken), as does
  // every later one. The first reason stays.
  void fail(const Status& why);

  size_t capacity() const override { return kBoardMessageBytes; }
  Status exchange(const OpFingerprint& fp, const void* data, size_t bytes,
                  const Deadline& deadline, std::vector<const char*>& views,
                  std::vector<size_t>& sizes) override;

 private:
  // fail()'s reason, or OK.
  Status failure();
  // Reads the messages of `round` that have come into views/sizes; counts down `missing`.
  Status scan(const OpFingerprint& fp, uint64_t round, std::vector<const char*>& views,
              std::vector<size_t>& sizes, int& missing);
  // Why a rank that has not published may never: this transport failed, or the peer runs
  // the call with messages, aborted, closed or (`probeProcesses`) died.
  Status broken(const OpFingerprint& fp, const std::vector<const char*>& views,
                bool probeProcesses);

  const int rank_;
  const int size_;
  const std::chrono::microseconds spin_;  // NANOCCL_SPIN_US
  const std::string me_;                  // "rank R", for errors
  TransportCounters& counters_;
  Segment* own_ = nullptr;
  std::vector<Peer> peers_;
  uint64_t round_ = 0;  // rounds so far (exchange()'s thread)
  std::atomic<bool> failed_{false};
  std::mutex failMu_;  // failure_
  Status failure_;
};

}  // namespace nanoccl::shm
