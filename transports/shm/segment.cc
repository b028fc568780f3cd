#include "transports/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>

#include "common/crypto.h"
#include "common/logging.h"
#include "transports/transport.h"

namespace nanoccl::shm {
namespace {

constexpr uint64_t kPage = 4096;

constexpr uint64_t roundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

constexpr uint64_t controlsOffset() { return roundUp(sizeof(SegmentHeader), 64); }
constexpr uint64_t chunkHeadersBytes() { return roundUp(kRingChunks * sizeof(FrameHeader), kPage); }
constexpr uint64_t ringStride() { return chunkHeadersBytes() + kRingChunks * kChunkBytes; }
uint64_t ringsOffset(int size) {
  return roundUp(controlsOffset() + static_cast<uint64_t>(size - 1) * sizeof(RingControl), kPage);
}
// The board follows the rings: two slots, each a BoardSlot and its message.
constexpr uint64_t boardStride() { return roundUp(sizeof(BoardSlot) + kBoardMessageBytes, kPage); }
uint64_t boardOffset(int size) {
  return ringsOffset(size) + static_cast<uint64_t>(size - 1) * ringStride();
}

// splitmix64's finaliser: spreads every input bit over the output.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t randomWord() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    // No entropy source: the time and the address space still differ between jobs.
    v = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        reinterpret_cast<uintptr_t>(&v);
  }
  return v;
}

// Reads a process's state letter and start time (fields 3 and 22 of /proc/<pid>/stat).
// false if it cannot be read.
bool readProcStat(const std::string& path, char* state, uint64_t* startTime, int* err) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return false;
  }
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) {
    *err = EIO;
    return false;
  }
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) {
    *err = EIO;
    return false;
  }
  ++p;
  int field = 2;
  while (*p != '\0' && field < 22) {
    while (*p == ' ') ++p;
    ++field;
    if (field == 3) *state = *p;
    if (field == 22) {
      *startTime = std::strtoull(p, nullptr, 10);
      return true;
    }
    while (*p != '\0' && *p != ' ') ++p;
  }
  *err = EIO;
  return false;
}

bool validName(const std::string& name) {
  const std::string prefix = std::string("/") + kNamePrefix;
  return name.size() > prefix.size() && name.size() < 200 &&
         name.compare(0, prefix.size(), prefix) == 0 && name.find('/', 1) == std::string::npos;
}

// The creator pid at the end of a segment name ("nanoccl-<hex>-<rank>-<pid>"), or 0.
int32_t pidFromName(const std::string& name) {
  const size_t dash = name.rfind('-');
  if (dash == std::string::npos || dash + 1 >= name.size()) return 0;
  int64_t pid = 0;
  for (size_t i = dash + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    pid = pid * 10 + (name[i] - '0');
    if (pid > INT32_MAX) return 0;
  }
  return static_cast<int32_t>(pid);
}

}  // namespace

void Doorbell::ring() {
  seq.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) != 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
  }
}

void Doorbell::sleep(uint32_t seen, std::chrono::microseconds timeout) {
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (seq.load(std::memory_order_seq_cst) == seen && timeout.count() > 0) {
    timespec ts;
    ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
    ts.tv_nsec = static_cast<long>(timeout.count() % 1000000) * 1000;
    // Shared, not FUTEX_PRIVATE: the ringers are other processes. EAGAIN (rung meanwhile),
    // EINTR and ETIMEDOUT all just mean "look again".
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq), FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

ProcessIdentity selfIdentity() {
  ProcessIdentity id;
  id.pid = static_cast<int32_t>(getpid());
  char state = 0;
  int err = 0;
  if (!readProcStat("/proc/self/stat", &state, &id.startTime, &err)) id.startTime = 0;
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) == 0) id.pidNamespace = st.st_ino;
  return id;
}

Status peerSegmentState(int rank, int peer, const SegmentHeader& h) {
  const auto state = static_cast<SegmentState>(h.state.load(std::memory_order_acquire));
  if (state == SegmentState::kAborted) {
    const size_t n = std::min<size_t>(h.abortLength, kMaxAbortText);
    return peerError("rank " + std::to_string(rank) + ": rank " + std::to_string(peer) +
                     " failed: " + std::string(h.abortText, n));
  }
  if (state == SegmentState::kClosed) {
    return peerError("rank " + std::to_string(rank) + ": rank " + std::to_string(peer) +
                     " closed its shared-memory transport (it exited, crashed or destroyed "
                     "its communicator)");
  }
  return Status::ok();
}

Status deadPeerError(int rank, int peer, int32_t pid) {
  return peerError("rank " + std::to_string(rank) + ": rank " + std::to_string(peer) + " (pid " +
                   std::to_string(pid) +
                   ") died without closing its shared-memory transport (killed or crashed)");
}

Liveness probe(const ProcessIdentity& who) {
  // Cached for the namespace and whether /proc works; not for the pid, which a fork()ed
  // child does not share.
  static const ProcessIdentity self = selfIdentity();
  if (who.pid <= 0) return Liveness::kUnknown;
  if (who.pidNamespace != self.pidNamespace) return Liveness::kUnknown;
  if (who.pid == static_cast<int32_t>(getpid())) return Liveness::kAlive;
  char state = 0;
  uint64_t start = 0;
  int err = 0;
  if (readProcStat("/proc/" + std::to_string(who.pid) + "/stat", &state, &start, &err)) {
    // A zombie has exited (its parent has not reaped it yet); a different start time means the
    // pid was reused by a younger process.
    if (state == 'Z' || state == 'X') return Liveness::kDead;
    if (who.startTime != 0 && start != who.startTime) return Liveness::kDead;
    return Liveness::kAlive;
  }
  if (err == ENOENT && self.startTime != 0) return Liveness::kDead;  // /proc works: it is gone
  // No usable /proc: fall back on the pid alone.
  if (kill(who.pid, 0) != 0 && errno == ESRCH) return Liveness::kDead;
  return Liveness::kAlive;
}

crypto::Mac segmentProof(const CommIdentity& member, const std::string& name,
                         const SegmentHeader& h) {
  using crypto::bytesOf;
  return member.prove("nanoccl shm segment v3",
                      {name, bytesOf(h.rank), bytesOf(h.size), bytesOf(h.pid),
                       bytesOf(h.startTime), bytesOf(h.pidNamespace), bytesOf(h.commIdHash)});
}

uint64_t Segment::bytesFor(int size) { return boardOffset(size) + 2 * boardStride(); }

Segment::Segment(std::string name, char* base, uint64_t bytes, int ownerRank, bool owner)
    : name_(std::move(name)), base_(base), bytes_(bytes), ownerRank_(ownerRank), linked_(owner) {}

Segment::~Segment() {
  unlink();
  munmap(base_, bytes_);
}

void Segment::unlink() {
  if (!linked_) return;
  linked_ = false;
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    NANOCCL_WARN("shm_unlink(" << name_ << "): " << std::strerror(errno));
  }
}

RingControl& Segment::control(int sender) {
  return reinterpret_cast<RingControl*>(base_ + controlsOffset())[ringIndex(sender)];
}

char* Segment::ring(int sender) {
  return base_ + ringsOffset(header().size) +
         static_cast<uint64_t>(ringIndex(sender)) * ringStride();
}

FrameHeader* Segment::chunkHeader(int sender, uint64_t slot) {
  return reinterpret_cast<FrameHeader*>(ring(sender)) + slot;
}

char* Segment::chunkData(int sender, uint64_t slot) {
  return ring(sender) + chunkHeadersBytes() + slot * kChunkBytes;
}

BoardSlot& Segment::boardSlot(uint64_t parity) {
  return *reinterpret_cast<BoardSlot*>(base_ + boardOffset(header().size) +
                                       (parity & 1) * boardStride());
}

char* Segment::boardData(uint64_t parity) {
  return reinterpret_cast<char*>(&boardSlot(parity)) + sizeof(BoardSlot);
}

Result<std::unique_ptr<Segment>> Segment::create(const Identity& id) {
  const uint64_t bytes = bytesFor(id.size);
  const std::string who = "rank " + std::to_string(id.rank) + ": ";
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 4 && fd < 0; ++attempt) {
    const uint64_t tag =
        mix(randomWord() ^ id.member.commHash());
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(tag));
    name = std::string("/") + kNamePrefix + hex + "-" + std::to_string(id.rank) + "-" +
           std::to_string(getpid());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) {
      return unavailableError(who + "cannot create shared-memory segment " + name + ": " +
                              std::strerror(errno) + " (is /dev/shm mounted and writable?)");
    }
  }
  if (fd < 0) return internalError(who + "no free shared-memory segment name after 4 tries");
  auto failWith = [&](Status st) {
    close(fd);
    shm_unlink(name.c_str());
    return st;
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return failWith(systemError("ftruncate of a shared-memory segment", errno));
  }
  // Reserve the pages now: on a full tmpfs a later first touch would be a SIGBUS.
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    if (err == ENOSPC || err == ENOMEM || err == EFBIG) {
      return failWith(unavailableError(
          who + "not enough room in /dev/shm for the shared-memory transport: it needs " +
          std::to_string(bytes >> 20) + " MiB per rank (" + std::to_string(id.size - 1) +
          " rings of " + std::to_string(kRingChunks) + " x " + std::to_string(kChunkBytes >> 10) +
          " KiB); enlarge /dev/shm (docker: --shm-size) or use the tcp transport"));
    }
    if (err != EOPNOTSUPP && err != EINVAL) {
      return failWith(systemError("posix_fallocate of a shared-memory segment", err));
    }
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return failWith(systemError("mmap of a shared-memory segment", errno));
  close(fd);
  auto seg = std::unique_ptr<Segment>(
      new Segment(name, static_cast<char*>(base), bytes, id.rank, true));

  // The pages are zero: construct the shared atomics in place, then the identity.
  SegmentHeader& h = seg->header();
  new (&h.bell.seq) std::atomic<uint32_t>(0);
  new (&h.bell.sleepers) std::atomic<uint32_t>(0);
  new (&h.boardBell.seq) std::atomic<uint32_t>(0);
  new (&h.boardBell.sleepers) std::atomic<uint32_t>(0);
  new (&h.messageCall) std::atomic<uint64_t>(0);
  new (&h.state) std::atomic<uint32_t>(static_cast<uint32_t>(SegmentState::kOpen));
  for (int s = 0; s < id.size; ++s) {
    if (s == id.rank) continue;
    RingControl& rc = seg->control(s);
    new (&rc.head.value) std::atomic<uint64_t>(0);
    new (&rc.tail.value) std::atomic<uint64_t>(0);
    new (&rc.senderWaiting.value) std::atomic<uint64_t>(0);
    new (&rc.attached.value) std::atomic<uint64_t>(0);
  }
  const ProcessIdentity self = selfIdentity();
  h.version = kSegmentVersion;
  h.ringChunks = kRingChunks;
  h.chunkBytes = kChunkBytes;
  h.totalBytes = bytes;
  h.rank = id.rank;
  h.size = id.size;
  h.pid = self.pid;
  h.startTime = self.startTime;
  h.pidNamespace = self.pidNamespace;
  h.commIdHash = id.member.commHash();
  // boardSlot() reads h.size.
  for (uint64_t parity = 0; parity < 2; ++parity) {
    new (&seg->boardSlot(parity).round) std::atomic<uint64_t>(0);
  }
  const crypto::Mac proof = segmentProof(id.member, name, h);
  std::memcpy(h.proof, proof.data(), sizeof(h.proof));
  std::atomic_thread_fence(std::memory_order_release);
  h.magic = kSegmentMagic;
  return seg;
}

Result<std::unique_ptr<Segment>> Segment::attach(const std::string& name, int peer,
                                                 const Identity& id) {
  const std::string who = "rank " + std::to_string(id.rank) +
                          ": the shared-memory segment of rank " + std::to_string(peer) + " (" +
                          name + ")";
  if (!validName(name)) {
    return protocolError("rank " + std::to_string(id.rank) + ": rank " + std::to_string(peer) +
                         " published '" + name.substr(0, 100) +
                         "', which is not a nanoccl shared-memory segment name");
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) {
      return peerError(who + " does not exist: rank " + std::to_string(peer) +
                       " died or gave up before setup ended, or its address is stale");
    }
    return protocolError(who + " cannot be opened: " + std::strerror(errno) +
                         " (another user's, or /dev/shm is not shared between the ranks)");
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return systemError("fstat of a shared-memory segment", errno);
  }
  if (st.st_uid != geteuid()) {
    close(fd);
    return protocolError(who + " belongs to uid " + std::to_string(st.st_uid) +
                         ", not to this job's user: refusing to attach");
  }
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (bytes < sizeof(SegmentHeader)) {
    close(fd);
    return protocolError(who + " is too small (" + std::to_string(bytes) + " bytes) to be one");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return systemError("mmap of a shared-memory segment", errno);
  auto seg =
      std::unique_ptr<Segment>(new Segment(name, static_cast<char*>(base), bytes, peer, false));
  const SegmentHeader& h = seg->header();
  if (h.magic != kSegmentMagic || h.version != kSegmentVersion) {
    return protocolError(who + " is not a nanoccl segment of version " +
                         std::to_string(kSegmentVersion));
  }
  // The comm id first: a segment of another communicator of this job is told apart from one
  // made without the secret (its proof is under another communicator key).
  if (h.commIdHash != id.member.commHash()) {
    return protocolError(who + " belongs to another communicator (comm id differs)");
  }
  if (!crypto::equalConstantTime(segmentProof(id.member, name, h).data(), h.proof,
                                 sizeof(h.proof))) {
    return protocolError(who + " was not created with this job's secret: refusing to attach "
                         "(a segment of another job, or two jobs sharing one store)");
  }
  if (h.rank != peer || h.size != id.size) {
    return protocolError(who + " was made by rank " + std::to_string(h.rank) + " of " +
                         std::to_string(h.size) + ", expected rank " + std::to_string(peer) +
                         " of " + std::to_string(id.size));
  }
  if (h.ringChunks != kRingChunks || h.chunkBytes != kChunkBytes || h.totalBytes != bytes ||
      bytes != bytesFor(id.size)) {
    return protocolError(who + " has rings of " + std::to_string(h.ringChunks) + " x " +
                         std::to_string(h.chunkBytes) + " bytes where rank " +
                         std::to_string(id.rank) + " uses " + std::to_string(kRingChunks) + " x " +
                         std::to_string(kChunkBytes) + " (different nanoccl builds)");
  }
  return seg;
}

int removeStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const ProcessIdentity self = selfIdentity();
  int removed = 0;
  while (dirent* e = readdir(dir)) {
    const std::string file = e->d_name;
    if (file.compare(0, std::strlen(kNamePrefix), kNamePrefix) != 0) continue;
    ProcessIdentity creator;
    creator.pid = pidFromName(file);
    creator.pidNamespace = self.pidNamespace;
    if (creator.pid <= 0) continue;
    const int fd =
        openat(dirfd(dir), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st;
    bool mine = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid();
    if (mine && static_cast<uint64_t>(st.st_size) >= sizeof(SegmentHeader)) {
      // A complete header names the creator precisely (start time, pid namespace).
      SegmentHeader h;
      if (pread(fd, &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h)) &&
          h.magic == kSegmentMagic && h.pid == creator.pid) {
        creator.startTime = h.startTime;
        creator.pidNamespace = h.pidNamespace;
      }
    }
    close(fd);
    if (!mine || probe(creator) != Liveness::kDead) continue;
    if (shm_unlink(("/" + file).c_str()) == 0) {
      ++removed;
      NANOCCL_INFO("removed stale shared-memory segment /dev/shm/" << file << " (creator pid "
                                                                  << creator.pid << " is gone)");
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace nanoccl::shm
