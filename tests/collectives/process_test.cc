// Ranks as real processes (fork) meeting through a FileStore on loopback: what a job
// without torch looks like.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "tests/collectives/test_util.h"

namespace nanoccl::colltest {
namespace {

// The child's whole life: returns the process exit code (0 = every check passed).
int childMain(const std::string& dir, int rank, int size, const std::string& engine) {
  CommunicatorOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::make_shared<FileStore>(dir);
  o.commId = "procs";
  o.config.socketIfname = "lo";
  o.config.tcpEngine = engine;
  o.timeout = std::chrono::milliseconds(15000);
  auto comm = Communicator::create(o);
  if (!comm.isOk()) {
    std::fprintf(stderr, "rank %d: create: %s\n", rank, comm.status().toString().c_str());
    return comm.status().code() == StatusCode::kUnavailable ? 77 : 2;
  }
  Communicator& c = *comm.value();
  const Deadline deadline = Deadline::after(std::chrono::seconds(30));
  auto fail = [&](const char* what, const Status& s) {
    std::fprintf(stderr, "rank %d: %s: %s\n", rank, what, s.toString().c_str());
    return 3;
  };

  // allreduce, small (recursive doubling) and large (ring).
  for (size_t count : {size_t{1023}, size_t{600000}}) {
    std::vector<int64_t> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<int64_t>(i % 97) + rank;
    if (Status s = c.allreduce(v.data(), count, DataType::kInt64, ReduceOp::kSum)->wait(deadline);
        !s.isOk()) {
      return fail("allreduce", s);
    }
    const int64_t ranksSum = static_cast<int64_t>(size) * (size - 1) / 2;
    for (size_t i = 0; i < count; ++i) {
      if (v[i] != static_cast<int64_t>(i % 97) * size + ranksSum) {
        std::fprintf(stderr, "rank %d: allreduce element %zu wrong\n", rank, i);
        return 4;
      }
    }
  }
  // allgather with uneven counts.
  std::vector<size_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = 100 + r;
  size_t total = 0;
  for (size_t x : counts) total += x;
  std::vector<float> mine(counts[rank], static_cast<float>(rank) + 0.25f), all(total, -1.0f);
  if (Status s = c.allgather(mine.data(), mine.size(), all.data(), counts, DataType::kFloat32)
                     ->wait(deadline);
      !s.isOk()) {
    return fail("allgather", s);
  }
  size_t at = 0;
  for (int r = 0; r < size; ++r) {
    for (size_t j = 0; j < counts[r]; ++j) {
      if (all[at++] != static_cast<float>(r) + 0.25f) return 5;
    }
  }
  // broadcast from the last rank, then a barrier.
  std::vector<uint8_t> b(5000, static_cast<uint8_t>(rank));
  if (Status s = c.broadcast(b.data(), b.size(), DataType::kUInt8, size - 1)->wait(deadline);
      !s.isOk()) {
    return fail("broadcast", s);
  }
  for (uint8_t x : b) {
    if (x != size - 1) return 6;
  }
  if (Status s = c.barrier()->wait(deadline); !s.isOk()) return fail("barrier", s);

  // Each rank leaves as soon as its own barrier is done: peers still finishing theirs must
  // get the messages that already arrived (an orderly close is not an error by itself).
  return 0;
}

class ProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ProcessTest, ForkedRanksOverFileStore) {
  constexpr int kSize = 3;
  char tmpl[] = "/tmp/nanoccl-filestore-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::vector<pid_t> pids;
  for (int r = 0; r < kSize; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(childMain(dir, r, kSize, GetParam()));
    pids.push_back(pid);
  }
  // Bounded wait: a child still running after 60 s is killed and counted as a failure.
  const Deadline deadline = Deadline::after(std::chrono::seconds(60));
  std::vector<int> codes(kSize, -1);
  int left = kSize;
  while (left > 0 && !deadline.expired()) {
    for (int r = 0; r < kSize; ++r) {
      if (codes[r] != -1) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < kSize; ++r) {
    if (codes[r] == -1) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], nullptr, 0);
    }
  }
  std::filesystem::remove_all(dir);
  bool skipped = true;
  for (int code : codes) skipped = skipped && code == 77;
  if (skipped) GTEST_SKIP() << GetParam() << " engine not available here";
  for (int r = 0; r < kSize; ++r)
    EXPECT_EQ(codes[r], 0) << "rank " << r << " (-1: hung and killed)";
}

INSTANTIATE_TEST_SUITE_P(Engines, ProcessTest, ::testing::Values("epoll", "uring"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace nanoccl::colltest
