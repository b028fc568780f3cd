#include "transports/shm/board.h"

#include <algorithm>
#include <cstring>

#include "common/spin.h"
#include "transports/frame.h"

namespace nanoccl::shm {

void ShmBoard::fail(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(failMu_);
    if (!failed_.load(std::memory_order_relaxed)) failure_ = why;
  }
  failed_.store(true, std::memory_order_release);
  if (own_ != nullptr) own_->header().boardBell.ring();
}

Status ShmBoard::failure() {
  if (!failed_.load(std::memory_order_acquire)) return Status::ok();
  std::lock_guard<std::mutex> lock(failMu_);
  return failure_;
}

Status ShmBoard::exchange(const OpFingerprint& fp, const void* data, size_t bytes,
                          const Deadline& deadline, std::vector<const char*>& views,
                          std::vector<size_t>& sizes) {
  if (bytes > kBoardMessageBytes) {
    return invalidArgument(me_ + ": " + std::to_string(bytes) + " bytes on the board (at most " +
                           std::to_string(kBoardMessageBytes) + ")");
  }
  if (own_ == nullptr) return invalidArgument(me_ + ": board used before connect()");
  views.assign(static_cast<size_t>(size_), nullptr);
  sizes.assign(static_cast<size_t>(size_), 0);
  NANOCCL_CHECK(failure());

  // Publish: the message, its header, then the round.
  const uint64_t round = ++round_;
  const uint64_t parity = round & 1;
  BoardSlot& mine = own_->boardSlot(parity);
  char* myData = own_->boardData(parity);
  if (bytes > 0) std::memcpy(myData, data, bytes);
  mine.frame = dataFrameHeader(fp, 0, fp.seq, bytes, 0, bytes);
  mine.round.store(round, std::memory_order_release);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    peers_[p].seg->header().boardBell.ring();
    counters_.sent(p, bytes);  // published, as a message counts once posted
  }
  views[rank_] = myData;
  sizes[rank_] = bytes;

  int missing = size_ - 1;
  NANOCCL_CHECK(scan(fp, round, views, sizes, missing));
  if (missing > 0) {
    spinFor(spin_, [&] { return !scan(fp, round, views, sizes, missing).isOk() || missing == 0; });
  }
  Doorbell& bell = own_->header().boardBell;
  Clock::time_point nextProbe = Clock::now();
  while (missing > 0) {
    const uint32_t seen = bell.seq.load(std::memory_order_acquire);
    NANOCCL_CHECK(scan(fp, round, views, sizes, missing));
    if (missing == 0) break;
    const bool probeNow = Clock::now() >= nextProbe;
    if (probeNow) nextProbe = Clock::now() + kLivenessPeriod;
    if (Status b = broken(fp, views, probeNow); !b.isOk()) {
      // The slots read again: a peer that failed on this very round (a mismatch it saw)
      // published first, and its slot names the calls, which says more than its failure does.
      // And a peer that posted this round after our last scan, finished it and went on to a
      // call with messages (its messageCall, which broken() read, is stored after its slot)
      // made this call here: every slot in, the call is done, not a mismatch.
      NANOCCL_CHECK(scan(fp, round, views, sizes, missing));
      if (missing == 0) break;
      return b;
    }
    if (deadline.expired()) {
      std::string who;
      for (int p = 0; p < size_; ++p) {
        if (p != rank_ && views[p] == nullptr) {
          who += (who.empty() ? "" : ", ") + std::to_string(p);
        }
      }
      return timeoutError(me_ + " waited on the shared-memory board, but rank(s) " + who +
                          " did not make the call #" + std::to_string(fp.seq) +
                          " before the deadline");
    }
    const auto left = std::chrono::microseconds(deadline.remainingMs(100) * 1000);
    bell.sleep(seen, std::clamp<std::chrono::microseconds>(
                         left, std::chrono::microseconds(1), kLivenessPeriod));
  }
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) counters_.received(p, sizes[p]);
  }
  return Status::ok();
}

// A slot holds this round or the one two before (0 at first); anything else is not a board
// in step with ours.
Status ShmBoard::scan(const OpFingerprint& fp, uint64_t round, std::vector<const char*>& views,
                      std::vector<size_t>& sizes, int& missing) {
  const uint64_t parity = round & 1;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || views[p] != nullptr) continue;
    Segment& seg = *peers_[p].seg;
    BoardSlot& slot = seg.boardSlot(parity);
    const uint64_t theirs = slot.round.load(std::memory_order_acquire);
    if (theirs != round) {
      if (theirs + 2 == round || (theirs == 0 && round <= 2)) continue;
      return protocolError(me_ + ": rank " + std::to_string(p) + "'s board slot holds round " +
                           std::to_string(theirs) + " where round " + std::to_string(round) +
                           " or " + std::to_string(round - 2) + " belongs (corrupt)");
    }
    FrameHeader h;  // a private copy: the peer's memory is not trusted twice
    std::memcpy(&h, &slot.frame, sizeof(h));
    Status st = validateFrameHeader(h);
    if (st.isOk() && (h.kind != FrameKind::kData || h.total > kBoardMessageBytes ||
                      h.length != h.total || h.offset != 0)) {
      st = protocolError("bad board header (" + std::to_string(h.total) + " bytes)");
    }
    if (!st.isOk()) return st.withContext(me_ + ": the board of rank " + std::to_string(p) + ": ");
    const OpFingerprint other = fingerprintOf(h);
    if (other != fp) {
      return mismatchError(me_ + " called " + fp.describe() + " but rank " + std::to_string(p) +
                           " called " + other.describe());
    }
    views[p] = seg.boardData(parity);
    sizes[p] = h.total;
    --missing;
  }
  return Status::ok();
}

Status ShmBoard::broken(const OpFingerprint& fp, const std::vector<const char*>& views,
                        bool probeProcesses) {
  NANOCCL_CHECK(failure());
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || views[p] != nullptr) continue;
    const SegmentHeader& h = peers_[p].seg->header();
    const uint64_t theirCall = h.messageCall.load(std::memory_order_acquire);
    if (theirCall > fp.seq) {
      return mismatchError(me_ + " runs " + fp.describe() +
                           " on the shared-memory board (its size fits there), but rank " +
                           std::to_string(p) + " runs call #" + std::to_string(theirCall - 1) +
                           " with messages (the ranks do not make the same calls, or not "
                           "with the same sizes)");
    }
    NANOCCL_CHECK(peerSegmentState(rank_, p, h));
    if (probeProcesses && probe(peers_[p].identity) == Liveness::kDead) {
      return deadPeerError(rank_, p, peers_[p].identity.pid);
    }
  }
  return Status::ok();
}

}  // namespace nanoccl::shm
