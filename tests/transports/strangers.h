// Strangers to a job, per transport: what a process that does not hold the job's secret can
// throw at the address a rank published. conformance_test.cc plays them against every row of
// the transport table.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/transports/raw_peer.h"

#ifdef NANOCCL_TEST_FABRIC
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "transports/fabric/libfabric.h"
#endif

namespace nanoccl::testing {

#ifdef NANOCCL_TEST_FABRIC
// A stranger on the fabric: a bare libfabric endpoint (the provider the transport uses) that
// sends whatever bytes a test gives it to a rank's endpoint, with the transport's tag.
class RawFabricPeer {
 public:
  explicit RawFabricPeer(const std::string& address) {
    Result<const fabric::Libfabric*> lib = fabric::loadLibfabric();
    if (!lib.isOk()) return;
    fi_ = *lib;
    fi_info* hints = fi_->dupinfo(nullptr);
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_TAGGED;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = 0;
    hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
    hints->domain_attr->name = strdup("lo");
    if (fi_->getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, &info_) != 0) info_ = nullptr;
    fi_->freeinfo(hints);
    if (info_ == nullptr || fi_->fabric(info_->fabric_attr, &fabric_, nullptr) != 0 ||
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
    if (info_ != nullptr) fi_->freeinfo(info_);
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
        ADD_FAILURE() << "stranger's send failed: " << fi_->strerror(err.err);
        ++completed_;
        continue;
      }
      if (n != 1 && n != -FI_EAGAIN) return false;
    }
    return completed_ == pending_.size();
  }
  bool send(const std::string& bytes) { return post(bytes) && drain(); }

 private:
  static constexpr uint64_t kFabricTag = 0x6e63636c66616272ull;  // transports/fabric/wire.h
  const fabric::Libfabric* fi_ = nullptr;
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
inline std::vector<std::string> fabricStrangersBytes() {
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
#endif

// tcp: four strangers at a listening rank while it waits for its peers: one that knows all but
// the secret, one that sends random bytes, one of this job's secret for another communicator,
// and one that says nothing (kept connected until the returned guard goes). Each of the first
// three must be turned away (the connection closed, nothing admitted).
inline std::shared_ptr<void> tcpStrangers(const std::string& address) {
  std::vector<int> turnedAway;
  {
    const int fd = dial(address);
    const Played p = handshake(fd, helloFor(1, 2), keyOf("not-the-secret"));
    EXPECT_FALSE(p.acceptorProved);
    EXPECT_FALSE(p.ack.has_value()) << "a wrong secret was admitted";
    turnedAway.push_back(fd);
  }
  {
    const int fd = dial(address);
    std::mt19937 rng(1);
    char junk[4096];
    for (char& c : junk) c = static_cast<char>(rng());
    send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
    turnedAway.push_back(fd);
  }
  {
    const int fd = dial(address);
    tcp::Hello h = helloFor(1, 2);
    h.commIdHash = hashCommId("other-comm");
    EXPECT_FALSE(handshake(fd, h, keyOf("test-secret")).ack.has_value());
    turnedAway.push_back(fd);
  }
  for (int fd : turnedAway) {
    EXPECT_TRUE(closedByPeer(fd)) << "a stranger was not turned away";
    close(fd);
  }
  auto silent = std::shared_ptr<int>(new int(dial(address)), [](int* fd) {
    if (*fd >= 0) close(*fd);
    delete fd;
  });
  return silent;
}

// shm: segments are the job's user's alone (0600); a process of another user cannot open the
// one a rank published. Needs root to become another user: false (nothing checked) without.
inline bool anotherUserCannotOpenSegment(const std::string& name) {
  if (geteuid() != 0) return false;
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    _exit(fd >= 0 ? 1 : errno == EACCES ? 0 : 2);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "another user's process opened " << name << " (exit " << WEXITSTATUS(status) << ")";
  return true;
}

}  // namespace nanoccl::testing
