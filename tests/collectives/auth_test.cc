// Who may join a job. The c10d store is unauthenticated: anyone who reaches it can read and
// write every key. With the secret out of band (NANOCCL_SECRET_FILE), such an attacker still
// cannot connect to a rank; with the store's secret (the default) the same attacker can, which
// is what the file is for (and shows the attack below is a real one).
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <mutex>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "tests/collectives/test_util.h"
#include "tests/transports/raw_peer.h"

namespace nanoccl::testing {
namespace {

// An InMemoryStore that lets the test read everything in it, as an attacker on the network
// could read a TCPStore.
class OpenStore : public Store {
 public:
  Status set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_[key] = value;
    }
    return inner_.set(key, value);
  }
  Result<std::string> get(const std::string& key, const Deadline& deadline) override {
    return inner_.get(key, deadline);
  }
  Result<int64_t> add(const std::string& key, int64_t delta) override {
    return inner_.add(key, delta);
  }
  Status wait(const std::vector<std::string>& keys, const Deadline& deadline) override {
    return inner_.wait(keys, deadline);
  }
  std::map<std::string, std::string> everything() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  InMemoryStore inner_;
  std::mutex mu_;
  std::map<std::string, std::string> seen_;
};

constexpr char kSecret[] = "f00dfeedcafe0123456789abcdef0042";

// kSecret in a file of its own directory with `mode`; both removed at the end of the test.
struct SecretFile {
  explicit SecretFile(mode_t mode) {
    char tmpl[] = "/tmp/nanoccl-auth-XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    path = dir + "/secret";
    std::ofstream(path) << kSecret << "\n";
    chmod(path.c_str(), mode);
  }
  ~SecretFile() { std::system(("rm -rf " + dir).c_str()); }
  std::string dir;
  std::string path;
};

class AuthTest : public ::testing::TestWithParam<bool> {  // param: the secret is in a file
 protected:
  CommunicatorOptions optionsFor(int rank, std::chrono::milliseconds timeout) {
    CommunicatorOptions co;
    co.rank = rank;
    co.size = 2;
    co.store = store_;
    co.commId = "auth-world";
    co.nodeId = rank == 0 ? "node-a" : "node-b";
    co.timeout = timeout;
    co.config.socketIfname = "lo";
    co.config.tcpEngine = "epoll";
    co.config.nsocks = 1;
    co.config.encrypt = true;
    if (GetParam()) co.config.secretFile = secret_.path;
    return co;
  }

  // Plays rank 1 against the real rank 0: writes the keys rank 0 waits for (the attacker can
  // write the store too), reads rank 0's address, and offers every value in the store as the
  // secret. Returns whether rank 0 admitted it. (The real rank 1 later overwrites addr/1.)
  bool attackRank0() {
    const std::string p = "nanoccl/auth-world/";
    const Deadline soon = Deadline::after(std::chrono::seconds(10));
    const std::string mode = store_->get(p + "auth/0", soon).value();
    EXPECT_TRUE(store_->set(p + "auth/1", mode).isOk());
    EXPECT_TRUE(store_->set(p + "node/1", "node-b").isOk());
    const std::string address = store_->get(p + "addr/0", soon).value();
    // Rank 0 waits for it; the job's settings in rank 0's address are no secret.
    EXPECT_TRUE(store_->set(p + "addr/1", publishedLike("127.0.0.1:1", address)).isOk());
    std::vector<std::string> guesses = {""};
    for (const auto& [key, value] : store_->everything()) guesses.push_back(value);
    bool admitted = false;
    for (const std::string& guess : guesses) {
      const int fd = dial(address);
      const tcp::Hello hello = helloFor(1, 2, 0, "auth-world");
      const Played played = handshake(fd, hello, keyOf(guess, "auth-world"));  // ids are no secret
      admitted = admitted || (played.ack && played.ack->verdict == tcp::HelloVerdict::kAccepted);
      close(fd);
    }
    return admitted;
  }

  SecretFile secret_{0600};
  std::shared_ptr<OpenStore> store_ = std::make_shared<OpenStore>();
};

TEST_P(AuthTest, AnAttackerWhoReadsAndWritesTheStoreGetsInOnlyWithoutTheFile) {
  const bool fileSecret = GetParam();
  auto rank0 = std::async(std::launch::async, [&] {
    return Communicator::create(optionsFor(0, std::chrono::milliseconds(fileSecret ? 20000 : 3000)));
  });
  const bool admitted = attackRank0();
  const auto stored = store_->everything();
  if (!fileSecret) {
    // The default mode: the secret sits in the store, and that is enough to get in.
    EXPECT_TRUE(admitted) << "the attack did not work even with the secret in the store";
    EXPECT_EQ(stored.count("nanoccl/auth-world/secret"), 1u);
    [[maybe_unused]] const auto made = rank0.get();  // the attacker never speaks again
    return;
  }
  EXPECT_FALSE(admitted) << "an attacker with the whole store joined despite the secret file";
  for (const auto& [key, value] : stored) {
    EXPECT_EQ(value.find(kSecret), std::string::npos) << "the secret is in the store at " << key;
    EXPECT_NE(key, "nanoccl/auth-world/secret");
  }
  // The real rank 1 still joins, and the job runs.
  auto rank1 = Communicator::create(optionsFor(1, std::chrono::milliseconds(20000)));
  ASSERT_TRUE(rank1.isOk()) << rank1.status().toString();
  auto made0 = rank0.get();
  ASSERT_TRUE(made0.isOk()) << made0.status().toString();
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
  auto t0 = made0.value()->allreduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum);
  auto t1 = rank1.value()->allreduce(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(t0->wait(Deadline::after(std::chrono::seconds(10))).isOk());
  ASSERT_TRUE(t1->wait(Deadline::after(std::chrono::seconds(10))).isOk());
  EXPECT_EQ(a[999], 3.0f);
  EXPECT_EQ(b[0], 3.0f);
}

INSTANTIATE_TEST_SUITE_P(Secret, AuthTest, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "file" : "store"; });

TEST(AuthSetup, RanksThatDisagreeAboutTheSecretSourceFailNamingIt) {
  const SecretFile secret(0600);
  const std::string& file = secret.path;
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::future<Result<std::shared_ptr<Communicator>>>> made;
  for (int r = 0; r < 2; ++r) {
    made.push_back(std::async(std::launch::async, [&, r] {
      CommunicatorOptions co;
      co.rank = r;
      co.size = 2;
      co.store = store;
      co.commId = "mixed";
      co.timeout = std::chrono::milliseconds(10000);
      co.config.socketIfname = "lo";
      if (r == 1) co.config.secretFile = file;
      return Communicator::create(co);
    }));
  }
  for (auto& f : made) {
    const auto r = f.get();
    ASSERT_EQ(r.status().code(), StatusCode::kMismatch) << r.status().toString();
    EXPECT_NE(r.status().message().find("NANOCCL_SECRET_FILE"), std::string::npos)
        << r.status().message();
  }
}

TEST(AuthSetup, ASecretFileOthersCanReadIsRefusedBeforeAnythingIsPublished) {
  const SecretFile secret(0644);
  const std::string& file = secret.path;
  auto store = std::make_shared<OpenStore>();
  CommunicatorOptions co;
  co.rank = 0;
  co.size = 2;
  co.store = store;
  co.commId = "loose";
  co.timeout = std::chrono::milliseconds(10000);
  co.config.secretFile = file;
  const auto r = Communicator::create(co);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().toString();
  EXPECT_NE(r.status().message().find("mode 0644"), std::string::npos) << r.status().message();
  EXPECT_TRUE(store->everything().empty());
}

}  // namespace
}  // namespace nanoccl::testing
