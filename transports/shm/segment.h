// One rank's POSIX shared-memory segment: its header (identity, doorbell, state), and one
// single-producer / single-consumer ring per sender, in which the peers write the messages
// meant for this rank.
//
// Ownership
// - Rank r creates (Segment::create) and owns segment r; every peer maps it (Segment::attach).
//   The rings live in the RECEIVER's segment: the receiver reads its chunks from memory it
//   allocated (first touched by its own fallocate, so local to its NUMA node), the sender
//   writes into it (remote stores are posted and cheap; remote loads stall), and the doorbell
//   a sender rings after publishing is in the same segment. Each segment's size is known when
//   it is created (one ring per other rank), before any peer is known.
// - Writers, field by field: the creator writes the identity fields once, before publishing
//   the name, and alone writes `state` / the abort text. A sender alone writes its ring's
//   head, its chunks and its `attached` flag; the receiver alone writes the ring's tail.
//   Anyone may ring the doorbell; only the creator's progress thread sleeps on it.
// - Names are "/nanoccl-<random hex>-<rank>-<pid>": unguessable (64 random bits mixed with the
//   secret and communicator id), created O_EXCL with mode 0600, and unlinked as soon as every
//   peer has mapped them, so nothing stays in /dev/shm after setup even if the job is killed.
//   A crash before that leaves a name whose pid no longer exists: removeStaleSegments()
//   (called from every listen()) removes those.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/crypto.h"
#include "common/status.h"
#include "transports/frame.h"
#include "transports/identity.h"

namespace nanoccl::shm {


// Ring geometry, the same on every rank (checked on attach). A message of any size streams
// through one ring chunk by chunk; a small one occupies one chunk.
constexpr uint32_t kRingChunks = 8;
constexpr uint64_t kChunkBytes = uint64_t{1} << 20;

constexpr uint64_t kSegmentMagic = 0x4d48534c4343414eull;  // "NACCLSHM"
constexpr uint32_t kSegmentVersion = 4;  // 3: proofs under the communicator key; 4: the board
constexpr const char* kNamePrefix = "nanoccl-";  // in /dev/shm, without the leading '/'

enum class SegmentState : uint32_t {
  kOpen = 0,
  kClosed = 1,   // the creator destroyed its transport with nothing pending
  kAborted = 2,  // the creator failed; abortText says why
};

// A futex word for one sleeper (the creator's progress thread) and any number of ringers, in
// shared memory (so the futex is not FUTEX_PRIVATE). Ringers make their data visible, then
// ring(); the sleeper snapshots `seq`, scans for work, then sleep(snapshot): either it sees
// the work, or `seq` moved since the snapshot and it does not sleep, or the ringer sees it
// in `sleepers` and wakes it.
struct Doorbell {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> sleepers;

  void ring();
  // Returns at once if seq != seen; else sleeps until a ring or `timeout`.
  void sleep(uint32_t seen, std::chrono::microseconds timeout);
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

struct alignas(64) PaddedCounter {
  std::atomic<uint64_t> value;
};

// The control block of one ring (sender -> this segment's creator).
// The sender sets `senderWaiting` when it finds the ring full; the receiver rings the sender's
// doorbell after freeing a chunk only then (both sides use seq_cst: one of them sees the other).
struct RingControl {
  PaddedCounter head;           // chunks published by the sender
  PaddedCounter tail;           // chunks consumed by the receiver
  PaddedCounter senderWaiting;  // 1 while the sender waits for room
  PaddedCounter attached;       // 1 once the sender has mapped this segment
};

// One of the two slots of a segment's board (transport.h: Board): rounds alternate between
// them. The creator alone writes a slot: its message, then the frame header (the round's
// fingerprint and length), then `round` (release); readers load `round` (acquire) and copy
// the header before trusting it. A slot is rewritten two rounds later, which no rank reaches
// before every rank has finished reading it (it needs everyone's next round first).
struct alignas(64) BoardSlot {
  std::atomic<uint64_t> round;  // the last round published here; 0: none yet
  uint64_t reserved[7];
  FrameHeader frame;
};
static_assert(sizeof(BoardSlot) == 128);

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t ringChunks;
  uint64_t chunkBytes;
  uint64_t totalBytes;
  int32_t rank;
  int32_t size;
  int32_t pid;
  uint32_t reserved;
  uint64_t startTime;     // the creator's start time (/proc/<pid>/stat), against pid reuse
  uint64_t pidNamespace;  // the creator's pid namespace inode: pids mean nothing across them
  uint64_t commIdHash;
  uint8_t proof[32];  // segmentProof(): a member's MAC of the fields above and the name
  alignas(64) Doorbell bell;
  // Rung by every peer after it publishes on its board, and by aborts; only the creator's
  // board waiter sleeps on it (after its spin).
  alignas(64) Doorbell boardBell;
  // 1 + the sequence number of the last collective call the creator posted a ring message
  // of: a board waiter whose peer runs its call with messages knows the ranks disagree.
  alignas(64) std::atomic<uint64_t> messageCall;
  alignas(64) std::atomic<uint32_t> state;  // SegmentState
  uint32_t abortLength;
  char abortText[kMaxAbortText];
};

// Who created a segment, and how to tell whether it still runs.
struct ProcessIdentity {
  int32_t pid = 0;
  uint64_t startTime = 0;
  uint64_t pidNamespace = 0;
};
ProcessIdentity selfIdentity();

enum class Liveness { kAlive, kDead, kUnknown };
// kDead when the process is gone, a zombie, or its pid now belongs to a younger process;
// kUnknown across pid namespaces (the creator's pid is not ours to look up).
Liveness probe(const ProcessIdentity& who);
// How often a waiter checks its peers' processes for life (also its longest futex sleep).
constexpr auto kLivenessPeriod = std::chrono::milliseconds(100);

// As rank `rank` sees it: kPeerError if rank `peer` marked its segment `h` aborted (quoting
// its reason) or closed; else OK.
Status peerSegmentState(int rank, int peer, const SegmentHeader& h);
// kPeerError: rank `peer` (process `pid`) died without closing its transport.
Status deadPeerError(int rank, int peer, int32_t pid);

// The creator's proof that it is a member of the communicator (transports/identity.h): a MAC
// of the segment's name and of who made it (rank, size, communicator, pid, start time, pid
// namespace), so a header copied from another segment or an earlier job does not verify. The
// secret itself is never written into shared memory.
crypto::Mac segmentProof(const CommIdentity& member, const std::string& name,
                         const SegmentHeader& h);

class Segment {
 public:
  struct Identity {
    int rank = 0;
    int size = 1;
    CommIdentity member;  // the job secret and comm id (transports/identity.h)
  };

  // Creates this rank's segment (O_EXCL, 0600), reserves its memory so a full /dev/shm is an
  // error here rather than a SIGBUS later, and fills the header.
  static Result<std::unique_ptr<Segment>> create(const Identity& id);
  // Maps peer `peer`'s segment `name` and checks it is what `id` (this rank's view of the job)
  // expects: a nanoccl segment of this version and geometry, made by the same user with the
  // same secret, for the same communicator, rank and size. Refuses (kProtocolError) otherwise.
  static Result<std::unique_ptr<Segment>> attach(const std::string& name, int peer,
                                                 const Identity& id);

  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  const std::string& name() const { return name_; }
  SegmentHeader& header() { return *reinterpret_cast<SegmentHeader*>(base_); }
  // The ring in which `sender` writes to this segment's creator.
  RingControl& control(int sender);
  FrameHeader* chunkHeader(int sender, uint64_t slot);
  char* chunkData(int sender, uint64_t slot);
  // Board slot `parity` (0, 1) and its kBoardMessageBytes of message.
  BoardSlot& boardSlot(uint64_t parity);
  char* boardData(uint64_t parity);

  // Removes the name (the creator, once every peer has mapped it). Idempotent.
  void unlink();

  // Bytes of a segment for a communicator of `size` ranks.
  static uint64_t bytesFor(int size);

 private:
  Segment(std::string name, char* base, uint64_t bytes, int ownerRank, bool owner);
  int ringIndex(int sender) const { return sender < ownerRank_ ? sender : sender - 1; }
  char* ring(int sender);

  std::string name_;
  char* base_;
  uint64_t bytes_;
  int ownerRank_;
  bool linked_;  // the creator's name still exists and is ours to remove
};

// Removes /dev/shm/nanoccl-* segments of this user whose creator (pid in the name, checked
// against the header's pid namespace when it can be read) no longer runs. Returns how many.
int removeStaleSegments();

}  // namespace nanoccl::shm
