// What is particular to the libfabric transport (the contract itself is conformance_test.cc):
// strangers on the endpoint (another job's secret, another communicator) are dropped without
// failing the job, addresses that are not fabric addresses are refused, encryption is refused
// rather than silently left out, and an FI_PROVIDER libfabric does not have is a clear error.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <future>
#include <string>
#include <vector>

#include "tests/transports/mesh.h"

#ifndef NANOCCL_FABRIC_PROBE
#error "NANOCCL_FABRIC_PROBE: the path of the fabric_probe helper"
#endif

namespace nanoccl::testing {
namespace {

Config fabricConfig() { return loopbackConfig("epoll", 1); }

std::unique_ptr<Transport> fabricRank(int rank, int size, const std::string& secret,
                                      const std::string& commId, std::string* address) {
  TransportOptions o = optionsFor(rank, size, fabricConfig(), secret);
  o.commId = commId;
  auto t = createTransport("fabric", o);
  EXPECT_TRUE(t.isOk()) << t.status().toString();
  auto a = t.value()->listen();
  EXPECT_TRUE(a.isOk()) << a.status().toString();
  *address = a.isOk() ? a.value() : "";
  return std::move(t).value();
}

// A stranger on the fabric: a bare libfabric endpoint (the provider the transport uses) that
// sends whatever bytes a test gives it to a rank's endpoint, with the transport's tag.
class RawFabricPeer {
 public:
  explicit RawFabricPeer(const std::string& address) {
    fi_info* hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_TAGGED;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = 0;
    hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
    hints->domain_attr->name = strdup("lo");
    if (fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, &info_) != 0) info_ = nullptr;
    fi_freeinfo(hints);
    if (info_ == nullptr || fi_fabric(info_->fabric_attr, &fabric_, nullptr) != 0 ||
        fi_domain(fabric_, info_, &domain_, nullptr) != 0) {
      return;
    }
    fi_cq_attr cqAttr{};
    cqAttr.format = FI_CQ_FORMAT_TAGGED;
    fi_av_attr avAttr{};
    avAttr.type = FI_AV_TABLE;
    if (fi_cq_open(domain_, &cqAttr, &cq_, nullptr) != 0 ||
        fi_av_open(domain_, &avAttr, &av_, nullptr) != 0 ||
        fi_endpoint(domain_, info_, &ep_, nullptr) != 0 ||
        fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV) != 0 ||
        fi_ep_bind(ep_, &av_->fid, 0) != 0 || fi_enable(ep_) != 0) {
      return;
    }
    // "fabric:<hex name>:<hex nonce>"
    const std::string hex = address.substr(7, address.find(':', 7) - 7);
    std::vector<uint8_t> name;
    for (size_t k = 0; k + 1 < hex.size(); k += 2) {
      name.push_back(static_cast<uint8_t>(std::stoi(hex.substr(k, 2), nullptr, 16)));
    }
    ok_ = fi_av_insert(av_, name.data(), 1, &target_, 0, nullptr) == 1;
  }
  ~RawFabricPeer() {
    for (fid* f : {ep_ ? &ep_->fid : nullptr, av_ ? &av_->fid : nullptr,
                   cq_ ? &cq_->fid : nullptr, domain_ ? &domain_->fid : nullptr,
                   fabric_ ? &fabric_->fid : nullptr}) {
      if (f != nullptr) fi_close(f);
    }
    if (info_ != nullptr) fi_freeinfo(info_);
  }
  bool ok() const { return ok_; }
  // Posts `bytes` with the transport's tag (kept until drain()).
  bool post(const std::string& bytes) {
    pending_.push_back(std::make_unique<Pending>());
    Pending& p = *pending_.back();
    p.bytes = bytes;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    ssize_t rc;
    do {
      rc = fi_tsend(ep_, p.bytes.data(), p.bytes.size(), nullptr, target_, kFabricTag, &p.ctx);
      fi_cq_tagged_entry e;
      if (rc == -FI_EAGAIN && fi_cq_read(cq_, &e, 1) == 1) ++completed_;
    } while (rc == -FI_EAGAIN && std::chrono::steady_clock::now() < until);
    return rc == 0;
  }
  // Waits until the provider completed everything posted; false on an error or at 10 s.
  bool drain() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (completed_ < pending_.size() && std::chrono::steady_clock::now() < until) {
      fi_cq_tagged_entry e;
      const ssize_t n = fi_cq_read(cq_, &e, 1);
      if (n == 1) ++completed_;
      if (n == -FI_EAVAIL) {  // an error completion: the provider gave up on one
        fi_cq_err_entry err{};
        fi_cq_readerr(cq_, &err, 0);
        ADD_FAILURE() << "stranger's send failed: " << fi_strerror(err.err);
        ++completed_;
        continue;
      }
      if (n != 1 && n != -FI_EAGAIN) return false;
    }
    return completed_ == pending_.size();
  }
  bool send(const std::string& bytes) { return post(bytes) && drain(); }

 private:
  static constexpr uint64_t kFabricTag = 0x6e63636c66616272ull;  // fabric_transport.cc
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  fi_addr_t target_ = FI_ADDR_UNSPEC;
  bool ok_ = false;
  struct Pending {
    fi_context ctx{};
    std::string bytes;
  };
  std::vector<std::unique_ptr<Pending>> pending_;
  size_t completed_ = 0;
};

// Bytes a stranger might send: nothing, short junk, a full-size frame of random bytes, a
// header claiming to be rank 1 with a made-up token, and more than a bounce buffer holds.
std::vector<std::string> strangersBytes() {
  std::vector<std::string> out = {std::string(), std::string(7, 'x')};
  std::mt19937_64 rng(7);
  std::string random(96 + 64, '\0');
  for (char& c : random) c = static_cast<char>(rng());
  out.push_back(random);
  std::string forged(96, '\0');
  const uint32_t from = 1, kind = 1;
  std::memcpy(&forged[16], &from, 4);
  std::memcpy(&forged[20], &kind, 4);
  out.push_back(forged);
  out.push_back(std::string(3 << 20, 'z'));
  return out;
}

// Strangers on rank 0's endpoint (bare endpoints sending garbage and forged frames, before and
// after setup; a transport with another job's secret; one of this job for another
// communicator) are dropped unread. The job sets up, the real rank 1's message is the one
// received, nothing of the strangers' is counted, and the transport keeps working.
TEST(FabricTransport, StrangersAndGarbageAreDroppedAndTheJobGoesOn) {
  std::string a0, a1;
  auto t0 = fabricRank(0, 2, "test-secret", "test-comm", &a0);
  auto t1 = fabricRank(1, 2, "test-secret", "test-comm", &a1);
  RawFabricPeer raw(a0);
  ASSERT_TRUE(raw.ok());
  auto c0 = std::async(std::launch::async, [&] { return t0->connect({a0, a1}, soon()); });
  ASSERT_TRUE(t1->connect({a0, a1}, soon()).isOk());
  ASSERT_TRUE(c0.get().isOk());
  for (const std::string& b : strangersBytes()) EXPECT_TRUE(raw.post(b)) << b.size();
  EXPECT_TRUE(raw.drain());
  // Transports of another job, and of this job's secret for another communicator: their
  // greetings do not prove anything to rank 0, so their setup times out naming rank 0.
  for (const auto& [secret, comm] : std::vector<std::pair<std::string, std::string>>{
           {"another-secret", "test-comm"}, {"test-secret", "another-comm"}}) {
    std::string as;
    auto s = fabricRank(1, 2, secret, comm, &as);
    const Status st = s->connect({a0, as}, Deadline::after(std::chrono::milliseconds(500)));
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_NE(st.message().find("rank(s) 0"), std::string::npos) << st.toString();
  }
  const uint8_t real = 42;
  ASSERT_TRUE(t1->isend(0, collectiveEnvelope(1, 0, 1), &real, 1)->wait(soon()).isOk());
  uint8_t got = 0;
  const Status st = t0->irecv(1, collectiveEnvelope(1, 0, 1), &got, 1)->wait(soon());
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(got, 42);
  EXPECT_EQ(t0->counters()[1].bytesReceived, 1u);
  EXPECT_EQ(t0->counters()[1].messagesReceived, 1u);
  const uint8_t back = 7;
  uint8_t got1 = 0;
  auto r = t1->irecv(0, collectiveEnvelope(2, 0, 1), &got1, 1);
  ASSERT_TRUE(t0->isend(1, collectiveEnvelope(2, 0, 1), &back, 1)->wait(soon()).isOk());
  ASSERT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(got1, 7);
}

// Ranks with different secrets cannot greet each other: setup fails on both, naming the
// secret, within the deadline.
TEST(FabricTransport, RanksWithDifferentSecretsFailSetupNamingTheSecret) {
  std::string a0, a1;
  auto t0 = fabricRank(0, 2, "secret-a", "test-comm", &a0);
  auto t1 = fabricRank(1, 2, "secret-b", "test-comm", &a1);
  const auto in = Deadline::after(std::chrono::seconds(2));
  auto c0 = std::async(std::launch::async, [&] { return t0->connect({a0, a1}, in); });
  const Status s1 = t1->connect({a0, a1}, in);
  const Status s0 = c0.get();
  for (const Status& st : {s0, s1}) {
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_NE(st.message().find("secret"), std::string::npos) << st.toString();
  }
}

TEST(FabricTransport, AddressesThatAreNotFabricAddressesAreRefused) {
  std::string a0;
  auto t0 = fabricRank(0, 2, "test-secret", "test-comm", &a0);
  for (const std::string bad : {"127.0.0.1:4242", "fabric:zz:00", "fabric:", "fabric:00:11"}) {
    const Status st = t0->connect({a0, bad}, soon());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad << ": " << st.toString();
    EXPECT_NE(st.message().find("not a fabric address"), std::string::npos) << st.toString();
  }
}

TEST(FabricTransport, EncryptionIsRefusedNotLeftOut) {
  Config c = fabricConfig();
  c.encrypt = true;
  auto t = createTransport("fabric", optionsFor(0, 2, c));
  ASSERT_FALSE(t.isOk());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("NANOCCL_ENCRYPT"), std::string::npos);
}

// FI_PROVIDER is read by libfabric at its first use in a process: the check runs in a fresh
// one (fabric_probe).
std::pair<int, std::string> probe(const std::string& provider) {
  const std::string cmd = "FI_PROVIDER='" + provider + "' " + NANOCCL_FABRIC_PROBE + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 512> buf{};
  while (f != nullptr && std::fgets(buf.data(), buf.size(), f) != nullptr) out += buf.data();
  const int rc = f != nullptr ? pclose(f) : -1;
  return {rc, out};
}

TEST(FabricTransport, AnUnknownProviderIsAClearErrorNotAFallBack) {
  const auto [rc, out] = probe("nosuchprovider");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("FI_PROVIDER=nosuchprovider"), std::string::npos) << out;
  // The default provider works where the bad one failed.
  const auto [ok, text] = probe("tcp;ofi_rxm");
  EXPECT_EQ(ok, 0) << text;
}

}  // namespace
}  // namespace nanoccl::testing
