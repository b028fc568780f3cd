// What is particular to the shared-memory transport, with ranks as threads of this process
// and, where it matters (a process that dies, a crash during setup), as fork()ed processes:
// the secret and the communicator id in the segment, nothing left in /dev/shm, peers that
// never connect or die. What every transport must do is in conformance_test.cc.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/transports/mesh.h"
#include "transports/shm/segment.h"

namespace nanoccl::testing {
namespace {


TransportOptions shmOptions(int rank, int size, const std::string& secret = "test-secret",
                            const std::string& commId = "test-comm") {
  TransportOptions o;
  o.rank = rank;
  o.size = size;
  o.commId = commId;
  o.secret = secret;
  return o;
}

// Creates and connects `size` shm transports in this process; rank r's secret is secretFor(r).
std::vector<std::unique_ptr<Transport>> makeShmMesh(
    int size, std::function<std::string(int)> secretFor = nullptr,
    std::vector<Status>* statuses = nullptr, int timeoutMs = 10000) {
  std::vector<std::unique_ptr<Transport>> ts(static_cast<size_t>(size));
  std::vector<std::string> addrs(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    auto t = createTransport("shm", shmOptions(r, size, secretFor ? secretFor(r) : "test-secret"));
    EXPECT_TRUE(t.isOk()) << t.status().toString();
    if (!t.isOk()) return {};
    ts[r] = std::move(t).value();
    auto a = ts[r]->listen();
    EXPECT_TRUE(a.isOk()) << a.status().toString();
    if (!a.isOk()) return {};
    addrs[r] = a.value();
  }
  std::vector<std::future<Status>> done;
  for (int r = 0; r < size; ++r) {
    done.push_back(std::async(std::launch::async, [&, r] {
      return ts[r]->connect(addrs, Deadline::after(std::chrono::milliseconds(timeoutMs)));
    }));
  }
  bool ok = true;
  for (int r = 0; r < size; ++r) {
    const Status st = done[r].get();
    if (statuses) statuses->push_back(st);
    ok = ok && st.isOk();
    if (!statuses) {
      EXPECT_TRUE(st.isOk()) << st.toString();
    }
  }
  if (!ok && !statuses) return {};
  return ts;
}

// This process's segments still named in /dev/shm.
std::vector<std::string> ourSegments(pid_t pid = getpid()) {
  std::vector<std::string> out;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return out;
  std::string suffix = "-";
  suffix += std::to_string(pid);
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(shm::kNamePrefix, 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(name);
    }
  }
  closedir(d);
  return out;
}

bool devShmHas(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

TEST(ShmTransportSetup, WorldOfOneNeedsNoSegment) {
  auto ts = makeShmMesh(1);
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_TRUE(ourSegments().empty());
  uint8_t x = 0;
  EXPECT_EQ(ts[0]->isend(0, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
}

TEST(ShmTransportSetup, NothingIsLeftInDevShmAfterConnect) {
  auto ts = makeShmMesh(4);
  ASSERT_EQ(ts.size(), 4u);
  EXPECT_TRUE(ourSegments().empty());
  // The mappings outlive the names: traffic still flows.
  uint8_t x = 5, y = 0;
  auto r = ts[3]->irecv(0, collectiveEnvelope(1, 0, 1), &y, 1);
  ASSERT_TRUE(ts[0]->isend(3, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).isOk());
  ASSERT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(y, 5);
  ts.clear();
  EXPECT_TRUE(ourSegments().empty());
}

TEST(ShmTransportSetup, AWrongSecretIsRefusedAndLeavesNothingBehind) {
  std::vector<Status> statuses;
  auto ts = makeShmMesh(
      2, [](int r) { return r == 0 ? std::string("secret-a") : std::string("secret-b"); },
      &statuses);
  ASSERT_EQ(statuses.size(), 2u);
  for (const Status& st : statuses) {
    ASSERT_FALSE(st.isOk());
    EXPECT_EQ(st.code(), StatusCode::kProtocolError) << st.toString();
    EXPECT_NE(st.message().find("secret"), std::string::npos) << st.message();
  }
  ts.clear();
  EXPECT_TRUE(ourSegments().empty());
}

TEST(ShmTransportSetup, AnotherCommunicatorsSegmentIsRefused) {
  auto a = createTransport("shm", shmOptions(0, 2, "s", "comm-a"));
  auto b = createTransport("shm", shmOptions(1, 2, "s", "comm-b"));
  ASSERT_TRUE(a.isOk() && b.isOk());
  auto na = a.value()->listen();
  auto nb = b.value()->listen();
  ASSERT_TRUE(na.isOk() && nb.isOk());
  const Status st = a.value()->connect({na.value(), nb.value()}, soon(2));
  EXPECT_EQ(st.code(), StatusCode::kProtocolError) << st.toString();
  EXPECT_NE(st.message().find("communicator"), std::string::npos) << st.message();
  // A name that is not a segment of ours is refused before anything is opened.
  auto c = createTransport("shm", shmOptions(0, 2));
  ASSERT_TRUE(c.isOk());
  auto nc = c.value()->listen();
  ASSERT_TRUE(nc.isOk());
  EXPECT_EQ(c.value()->connect({nc.value(), "/../etc/passwd"}, soon(2)).code(),
            StatusCode::kProtocolError);
}

TEST(ShmTransportSetup, APeerThatNeverConnectsTimesOutNamingIt) {
  auto a = createTransport("shm", shmOptions(0, 2));
  auto b = createTransport("shm", shmOptions(1, 2));
  ASSERT_TRUE(a.isOk() && b.isOk());
  auto na = a.value()->listen();
  auto nb = b.value()->listen();
  ASSERT_TRUE(na.isOk() && nb.isOk());
  const Status st =
      a.value()->connect({na.value(), nb.value()}, Deadline::after(std::chrono::milliseconds(300)));
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
  EXPECT_NE(st.message().find("rank(s) 1"), std::string::npos) << st.message();
  // A failed connect keeps the name (slower peers read the reason there) until destruction.
  a.value().reset();
  b.value().reset();
  EXPECT_TRUE(ourSegments().empty());
}

TEST(ShmTransportSetup, UnknownTransportListsShm) {
  const auto st = createTransport("carrier-pigeon", shmOptions(0, 1)).status();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("shm"), std::string::npos) << st.message();
}

// ---- ranks as processes ------------------------------------------------------------------

bool writeString(int fd, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  return write(fd, &n, 4) == 4 && write(fd, s.data(), n) == static_cast<ssize_t>(n);
}

std::optional<std::string> readString(int fd, int timeoutMs = 10000) {
  std::string out;
  uint32_t n = 0;
  size_t got = 0;
  std::vector<char> buf;
  const auto deadline = Deadline::after(std::chrono::milliseconds(timeoutMs));
  auto readSome = [&](char* dst, size_t len) {
    size_t done = 0;
    while (done < len) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, deadline.remainingMs()) <= 0) return false;
      const ssize_t k = read(fd, dst + done, len - done);
      if (k <= 0) return false;
      done += static_cast<size_t>(k);
    }
    return true;
  };
  if (!readSome(reinterpret_cast<char*>(&n), 4) || n > 4096) return std::nullopt;
  buf.resize(n);
  if (!readSome(buf.data(), n)) return std::nullopt;
  (void)got;
  return std::string(buf.data(), n);
}

// A child process running `body(toParent, fromParent)`; its return value is the exit code.
struct Child {
  pid_t pid = -1;
  int toChild = -1;
  int fromChild = -1;

  static Child start(const std::function<int(int, int)>& body) {
    int down[2], up[2];
    Child c;
    if (pipe(down) != 0 || pipe(up) != 0) return c;
    c.pid = fork();
    if (c.pid == 0) {
      close(down[1]);
      close(up[0]);
      alarm(30);  // never outlive a hung test
      _exit(body(up[1], down[0]));
    }
    close(down[0]);
    close(up[1]);
    c.toChild = down[1];
    c.fromChild = up[0];
    return c;
  }

  // The exit status (as waitpid reports it), killing the child after `timeoutMs`.
  int reap(int timeoutMs = 20000) {
    int status = -1;
    const auto deadline = Deadline::after(std::chrono::milliseconds(timeoutMs));
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (deadline.expired()) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    close(toChild);
    close(fromChild);
    return status;
  }
};

// Rank 1 in a child process: exchanges addresses with the parent (rank 0) over pipes.
Result<std::unique_ptr<Transport>> childRank(int toParent, int fromParent) {
  NANOCCL_ASSIGN_OR_RETURN(auto t, createTransport("shm", shmOptions(1, 2)));
  NANOCCL_ASSIGN_OR_RETURN(std::string mine, t->listen());
  if (!writeString(toParent, mine)) return internalError("pipe");
  auto theirs = readString(fromParent);
  if (!theirs) return internalError("pipe");
  NANOCCL_CHECK(t->connect({*theirs, mine}, soon()));
  return t;
}

std::unique_ptr<Transport> parentRank(Child& child) {
  auto t = createTransport("shm", shmOptions(0, 2));
  EXPECT_TRUE(t.isOk());
  if (!t.isOk()) return nullptr;
  auto mine = t.value()->listen();
  EXPECT_TRUE(mine.isOk()) << mine.status().toString();
  if (!mine.isOk()) return nullptr;
  EXPECT_TRUE(writeString(child.toChild, mine.value()));
  auto theirs = readString(child.fromChild);
  EXPECT_TRUE(theirs.has_value());
  if (!theirs) return nullptr;
  const Status st = t.value()->connect({mine.value(), *theirs}, soon());
  EXPECT_TRUE(st.isOk()) << st.toString();
  if (!st.isOk()) return nullptr;
  return std::move(t).value();
}

TEST(ShmTransportProcesses, TwoProcessesExchangeLargeMessages) {
  const size_t n = 64 << 20;
  Child child = Child::start([n](int toParent, int fromParent) {
    auto t = childRank(toParent, fromParent);
    if (!t.isOk()) return 2;
    // Echo: receive a message, send it back, then a p2p message after it.
    std::vector<uint8_t> buf(n);
    if (!t.value()->irecv(0, collectiveEnvelope(1, 0, n), buf.data(), n)->wait(soon()).isOk()) {
      return 3;
    }
    if (!t.value()->isend(0, collectiveEnvelope(2, 0, n), buf.data(), n)->wait(soon()).isOk()) {
      return 4;
    }
    int32_t v = 77;
    if (!t.value()->isend(0, p2pEnvelope(1, 1, DataType::kInt32), &v, 4)->wait(soon()).isOk()) {
      return 5;
    }
    // Stay until the parent has read everything (it closes the pipe).
    (void)readString(fromParent);
    return 0;
  });
  ASSERT_GT(child.pid, 0);
  auto t = parentRank(child);
  ASSERT_TRUE(t != nullptr);
  EXPECT_TRUE(ourSegments().empty());
  const auto src = pattern(n, 42);
  std::vector<uint8_t> back(n);
  int32_t w = 0;
  auto r = t->irecv(1, collectiveEnvelope(2, 0, n), back.data(), n);
  auto rp = t->irecv(kAnySource, p2pEnvelope(1, 1, DataType::kInt32), &w, 4);
  ASSERT_TRUE(t->isend(1, collectiveEnvelope(1, 0, n), src.data(), n)->wait(soon()).isOk());
  ASSERT_TRUE(r->wait(soon()).isOk());
  ASSERT_TRUE(rp->wait(soon()).isOk());
  EXPECT_TRUE(back == src);
  EXPECT_EQ(w, 77);
  EXPECT_EQ(rp->source(), 1);
  EXPECT_TRUE(ourSegments(child.pid).empty());  // the child sent, so its connect() ended
  EXPECT_TRUE(writeString(child.toChild, "bye"));
  const int status = child.reap();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

TEST(ShmTransportProcesses, APeerKilledWithSigkillFailsThePendingReceive) {
  Child child = Child::start([](int toParent, int fromParent) {
    auto t = childRank(toParent, fromParent);
    if (!t.isOk()) return 2;
    writeString(toParent, "connected");
    (void)readString(fromParent, 25000);  // until killed
    return 0;
  });
  ASSERT_GT(child.pid, 0);
  auto t = parentRank(child);
  ASSERT_TRUE(t != nullptr);
  ASSERT_EQ(readString(child.fromChild).value_or(""), "connected");
  std::vector<uint8_t> dst(1 << 20);
  auto r = t->irecv(1, collectiveEnvelope(1, 0, dst.size()), dst.data(), dst.size());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(child.pid, SIGKILL), 0);
  // Not reaped yet: the child is a zombie, which counts as dead.
  const Status st = r->wait(soon());
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("died"), std::string::npos) << st.message();
  std::printf("  peer error after %.1f ms: %s\n",
              std::chrono::duration<double, std::milli>(took).count(), st.message().c_str());
  const int status = child.reap();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  // Later sends fail at once.
  uint8_t b = 0;
  EXPECT_EQ(t->isend(1, collectiveEnvelope(2, 0, 1), &b, 1)->wait(soon()).code(),
            StatusCode::kPeerError);
}

// The board (transport.h: Board) between two processes: rounds back to back, each rank's
// message seen by the other; then a peer killed before it publishes fails the round as dead.
OpFingerprint boardCall(uint64_t round) {
  OpFingerprint fp;
  fp.op = OpType::kAllreduce;
  fp.dtype = DataType::kInt64;
  fp.count = 2;
  fp.seq = round;
  return fp;
}

// Garbage in a peer's board slot (its header, or a round out of step) is a protocol error
// naming the peer, never data taken as a message. The test maps rank 1's segment itself,
// before connect() removes the name, and writes into the slot rank 0 reads in round 1.
TEST(ShmBoard, GarbageInAPeersSlotIsAProtocolError) {
  for (const bool badRound : {false, true}) {
    SCOPED_TRACE(badRound ? "a round out of step" : "a garbage header");
    auto a = createTransport("shm", shmOptions(0, 2));
    auto b = createTransport("shm", shmOptions(1, 2));
    ASSERT_TRUE(a.isOk() && b.isOk());
    auto na = a.value()->listen();
    auto nb = b.value()->listen();
    ASSERT_TRUE(na.isOk() && nb.isOk());
    auto theirs = shm::Segment::attach(
        nb.value(), 1, shm::Segment::Identity{0, 2, CommIdentity("test-secret", "test-comm")});
    ASSERT_TRUE(theirs.isOk()) << theirs.status().toString();
    auto cb = std::async(std::launch::async, [&] {
      return b.value()->connect({na.value(), nb.value()}, soon());
    });
    ASSERT_TRUE(a.value()->connect({na.value(), nb.value()}, soon()).isOk());
    ASSERT_TRUE(cb.get().isOk());
    shm::BoardSlot& slot = theirs.value()->boardSlot(1);
    if (badRound) {
      slot.round.store(7);
    } else {
      std::memset(&slot.frame, 0xab, sizeof(slot.frame));
      slot.round.store(1);
    }
    std::vector<const char*> views;
    std::vector<size_t> sizes;
    const int64_t mine = 1;
    const Status st = a.value()->board()->exchange(boardCall(1), &mine, sizeof(mine), soon(),
                                                   views, sizes);
    EXPECT_EQ(st.code(), StatusCode::kProtocolError) << st.toString();
    EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  }
}

TEST(ShmTransportProcesses, TheBoardBetweenProcessesAndAPeerKilledBeforeItPublishes) {
  constexpr int kRounds = 200;
  Child child = Child::start([](int toParent, int fromParent) {
    auto t = childRank(toParent, fromParent);
    if (!t.isOk() || t.value()->board() == nullptr) return 2;
    std::vector<const char*> views;
    std::vector<size_t> sizes;
    for (int64_t k = 1; k <= kRounds; ++k) {
      const int64_t mine[2] = {k, -k};
      if (!t.value()->board()->exchange(boardCall(k), mine, sizeof(mine), soon(), views, sizes)
               .isOk()) {
        return 3;
      }
      int64_t theirs[2];
      std::memcpy(theirs, views[0], sizeof(theirs));
      if (sizes[0] != sizeof(theirs) || theirs[0] != 1000 + k || theirs[1] != k) return 4;
    }
    writeString(toParent, "rounds done");
    (void)readString(fromParent, 25000);  // until killed
    return 0;
  });
  ASSERT_GT(child.pid, 0);
  auto t = parentRank(child);
  ASSERT_TRUE(t != nullptr);
  Board* board = t->board();
  ASSERT_NE(board, nullptr);
  std::vector<const char*> views;
  std::vector<size_t> sizes;
  for (int64_t k = 1; k <= kRounds; ++k) {
    const int64_t mine[2] = {1000 + k, k};
    ASSERT_TRUE(board->exchange(boardCall(k), mine, sizeof(mine), soon(), views, sizes).isOk());
    int64_t theirs[2];
    std::memcpy(theirs, views[1], sizeof(theirs));
    ASSERT_EQ(theirs[0], k);
    ASSERT_EQ(theirs[1], -k);
  }
  ASSERT_EQ(readString(child.fromChild).value_or(""), "rounds done");
  ASSERT_EQ(kill(child.pid, SIGKILL), 0);
  const int64_t last[2] = {0, 0};
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = board->exchange(boardCall(kRounds + 1), last, sizeof(last), soon(), views,
                                    sizes);
  ASSERT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("died"), std::string::npos) << st.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  const int status = child.reap();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

TEST(ShmTransportProcesses, ASetupCrashLeavesASegmentTheNextListenRemoves) {
  // A rank that dies between listen() and the end of connect() leaves its name behind.
  Child child = Child::start([](int toParent, int) {
    auto t = createTransport("shm", shmOptions(1, 2));
    if (!t.isOk()) return 2;
    auto name = t.value()->listen();
    if (!name.isOk()) return 3;
    writeString(toParent, name.value());
    _exit(0);  // a crash: no destructor runs
  });
  ASSERT_GT(child.pid, 0);
  const auto name = readString(child.fromChild);
  ASSERT_TRUE(name.has_value());
  const int status = child.reap();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string file = name->substr(1);
  // The crash left `file` behind, unless another test process's listen() (ctest runs several
  // at once) already cleaned it, which is the behaviour under test too: so no assertion here.
  RecordProperty("left_behind_before_listen", devShmHas(file) ? "yes" : "cleaned concurrently");

  // Also a bare name (no header) from a dead pid, and one whose creator (this process) lives.
  const std::string bare = std::string(shm::kNamePrefix) + "00000000deadbeef-3-" +
                           std::to_string(child.pid);
  const std::string live = std::string(shm::kNamePrefix) + "00000000cafef00d-0-" +
                           std::to_string(getpid());
  for (const std::string& n : {bare, live}) {
    const int fd = shm_open(("/" + n).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << n << ": " << std::strerror(errno);
    close(fd);
  }
  auto t = createTransport("shm", shmOptions(0, 2));
  ASSERT_TRUE(t.isOk());
  ASSERT_TRUE(t.value()->listen().isOk());  // listen() cleans up
  EXPECT_FALSE(devShmHas(file));
  EXPECT_FALSE(devShmHas(bare));
  EXPECT_TRUE(devShmHas(live));
  shm_unlink(("/" + live).c_str());
  t.value().reset();
  EXPECT_TRUE(ourSegments().empty());
}

// Runs last in the binary's order: every test above cleaned up after itself.
// After every test, whatever it did (ctest runs each test in a process of its own, so a test
// "run last" would only ever see its own process): no segment of this process is left named in
// /dev/shm.
class NoSegmentLeft : public ::testing::Environment {
 public:
  void TearDown() override {
    const auto left = ourSegments();
    if (!left.empty()) {
      ADD_FAILURE() << left.size() << " shared-memory segment(s) of this process left in "
                    << "/dev/shm, e.g. " << left.front();
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kNoSegmentLeft =
    ::testing::AddGlobalTestEnvironment(new NoSegmentLeft);

}  // namespace
}  // namespace nanoccl::testing
