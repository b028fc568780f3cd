// The Store implementations: InMemoryStore, FileStore (threads and processes), PrefixStore.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "collectives/device/host_device.h"
#include "collectives/planner.h"
#include "tests/collectives/test_util.h"

namespace nanoccl::colltest {
namespace {

using std::chrono::milliseconds;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/nanoccl-store-test-XXXXXX";
    path_ = mkdtemp(tmpl) ? tmpl : "";
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The same behaviour from both implementations.
class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      store_ = std::make_shared<InMemoryStore>();
    } else {
      ASSERT_FALSE(dir_.path().empty());
      store_ = std::make_shared<FileStore>(dir_.path() + "/sub/dir");
    }
  }
  TempDir dir_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreTest, SetGetOverwrite) {
  ASSERT_TRUE(store_->set("a", "1").isOk());
  auto v = store_->get("a", Deadline::after(milliseconds(100)));
  ASSERT_TRUE(v.isOk()) << v.status().toString();
  EXPECT_EQ(v.value(), "1");
  ASSERT_TRUE(store_->set("a", std::string("bin\0ary", 7)).isOk());
  v = store_->get("a", Deadline::after(milliseconds(100)));
  ASSERT_TRUE(v.isOk());
  EXPECT_EQ(v.value(), std::string("bin\0ary", 7));
  ASSERT_TRUE(store_->set("empty", "").isOk());
  v = store_->get("empty", Deadline::after(milliseconds(100)));
  ASSERT_TRUE(v.isOk());
  EXPECT_EQ(v.value(), "");
}

TEST_P(StoreTest, KeysWithSlashesAndOddCharacters) {
  const std::vector<std::string> keys = {"nanoccl/0/addr/3", "../escape",          ".", "a b%c",
                                         "x/../y",           std::string(300, 'k')};
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(store_->set(keys[i], std::to_string(i)).isOk()) << keys[i];
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    auto v = store_->get(keys[i], Deadline::after(milliseconds(100)));
    ASSERT_TRUE(v.isOk()) << keys[i];
    EXPECT_EQ(v.value(), std::to_string(i)) << keys[i];
  }
}

TEST_P(StoreTest, GetAndWaitTimeOut) {
  auto v = store_->get("missing", Deadline::after(milliseconds(50)));
  EXPECT_EQ(v.status().code(), StatusCode::kTimeout);
  EXPECT_NE(v.status().message().find("missing"), std::string::npos);
  ASSERT_TRUE(store_->set("here", "x").isOk());
  EXPECT_EQ(store_->wait({"here", "missing"}, Deadline::after(milliseconds(50))).code(),
            StatusCode::kTimeout);
  EXPECT_TRUE(store_->wait({"here"}, Deadline::after(milliseconds(50))).isOk());
}

TEST_P(StoreTest, GetWaitsForALaterSet) {
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(30));
    EXPECT_TRUE(store_->set("later", "v").isOk());
  });
  auto v = store_->get("later", Deadline::after(milliseconds(10000)));
  setter.join();
  ASSERT_TRUE(v.isOk()) << v.status().toString();
  EXPECT_EQ(v.value(), "v");
  EXPECT_TRUE(store_->wait({"later"}, Deadline::never()).isOk());
}

TEST_P(StoreTest, AddIsAtomicAcrossThreads) {
  constexpr int kThreads = 4;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) EXPECT_TRUE(store_->add("counter", 1).isOk());
    });
  }
  for (auto& t : threads) t.join();
  auto v = store_->add("counter", 0);
  ASSERT_TRUE(v.isOk());
  EXPECT_EQ(v.value(), kThreads * kAdds);
  auto text = store_->get("counter", Deadline::after(milliseconds(100)));
  ASSERT_TRUE(text.isOk());
  EXPECT_EQ(text.value(), std::to_string(kThreads * kAdds));
  EXPECT_EQ(store_->add("counter", -5).value(), kThreads * kAdds - 5);
  ASSERT_TRUE(store_->set("text", "abc").isOk());
  EXPECT_EQ(store_->add("text", 1).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(StoreTest, PrefixStoreSeparatesNamespaces) {
  PrefixStore a("nanoccl/a", store_), b("nanoccl/b", store_);
  ASSERT_TRUE(a.set("k", "A").isOk());
  ASSERT_TRUE(b.set("k", "B").isOk());
  EXPECT_EQ(a.get("k", Deadline::after(milliseconds(100))).value(), "A");
  EXPECT_EQ(b.get("k", Deadline::after(milliseconds(100))).value(), "B");
  EXPECT_EQ(store_->get("nanoccl/a/k", Deadline::after(milliseconds(100))).value(), "A");
  EXPECT_EQ(a.add("n", 2).value(), 2);
  EXPECT_TRUE(a.wait({"k", "n"}, Deadline::after(milliseconds(100))).isOk());
}

INSTANTIATE_TEST_SUITE_P(Kinds, StoreTest, ::testing::Values("memory", "file"),
                         [](const auto& info) { return info.param; });

// add() from several processes on one directory: flock makes it atomic.
TEST(FileStore, AddIsAtomicAcrossProcesses) {
  TempDir dir;
  constexpr int kProcs = 3;
  constexpr int kAdds = 40;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      FileStore s(dir.path());
      for (int i = 0; i < kAdds; ++i) {
        if (!s.add("counter", 1).isOk()) _exit(1);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    // The children do a bounded amount of work; each add() has its own lock deadline.
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  FileStore s(dir.path());
  EXPECT_EQ(s.add("counter", 0).value(), kProcs * kAdds);
}

// The planner: "auto" by size, forced names, and the errors for bad names.
TEST(Planner, AutoPicksBySizeAndForcedNamesApply) {
  detail::CallArgs small;
  small.op = OpType::kAllreduce;
  small.dtype = DataType::kFloat32;
  small.count = 16;
  detail::CallArgs large = small;
  large.count = 1 << 20;
  Config c;
  const Topology flat = Topology::singleNode(4);
  // One node: small calls on its shared-memory board; on several, recursive doubling.
  EXPECT_STREQ(detail::planAlgorithm(small, flat, c).value()->name, "board");
  EXPECT_STREQ(detail::planAlgorithm(small, Topology::fromNodeIds({"a", "a", "b", "b"}), c)
                   .value()->name,
               "recursive_doubling");
  EXPECT_STREQ(detail::planAlgorithm(large, flat, c).value()->name, "ring");
  c.algo = "tree";
  EXPECT_STREQ(detail::planAlgorithm(large, flat, c).value()->name, "tree");
  c.algo = "pairwise";  // an alltoall algorithm: allreduce stays on auto
  EXPECT_STREQ(detail::planAlgorithm(large, flat, c).value()->name, "ring");
  c.algo = "nope";
  auto bad = detail::planAlgorithm(small, flat, c);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("dissemination"), std::string::npos);
}

// Every op has a row that "auto" can pick, and names are unique per op.
TEST(Planner, TableCoversEveryOp) {
  const auto& table = detail::algorithmTable();
  for (OpType op : {OpType::kAllreduce, OpType::kReduce, OpType::kBroadcast, OpType::kAllgather,
                    OpType::kReduceScatter, OpType::kAlltoall, OpType::kGather, OpType::kScatter,
                    OpType::kBarrier}) {
    int rows = 0;
    for (const auto& row : table) {
      if (row.op != op) continue;
      ++rows;
      for (const auto& other : table) {
        if (&other != &row && other.op == op) {
          EXPECT_STRNE(other.name, row.name);
        }
      }
    }
    EXPECT_GT(rows, 0) << opTypeName(op);
  }
}

// Calls on device memory take the device rows, by topology, and host calls never do; the rows
// are in the table under their names, for every op a device call can make.
TEST(Planner, DeviceCallsTakeDeviceRows) {
  detail::CallArgs call;
  call.dtype = DataType::kFloat32;
  call.count = 1 << 20;
  Config c;
  const Topology oneNode = Topology::singleNode(2);
  const Topology twoNodes = Topology::fromNodeIds({"a", "a", "b", "b"});
  for (OpType op : {OpType::kAllreduce, OpType::kBroadcast, OpType::kAllgather,
                    OpType::kReduceScatter}) {
    SCOPED_TRACE(opTypeName(op));
    call.op = op;
    call.device = nullptr;
    EXPECT_STRNE(detail::planAlgorithm(call, twoNodes, c).value()->name, "device_staged");
    call.device = std::make_shared<HostDevice>();
    EXPECT_STREQ(detail::planAlgorithm(call, oneNode, c).value()->name, "device_node");
    EXPECT_STREQ(detail::planAlgorithm(call, twoNodes, c).value()->name, "device_staged");
    Config forced;
    forced.algo = "ring";  // a host row: device calls stay on auto
    EXPECT_STREQ(detail::planAlgorithm(call, twoNodes, forced).value()->name, "device_staged");
    forced.algo = "device_node";
    EXPECT_EQ(detail::planAlgorithm(call, twoNodes, forced).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_TRUE(detail::checkAlgorithmName("device_staged").isOk());
  }
}

}  // namespace
}  // namespace nanoccl::colltest
