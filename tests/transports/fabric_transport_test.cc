// What is particular to the libfabric transport (the contract itself is conformance_test.cc):
// strangers on the endpoint (another job's secret, another communicator) are dropped without
// failing the job, addresses that are not fabric addresses are refused, encryption is refused
// rather than silently left out, and an FI_PROVIDER libfabric does not have is a clear error.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
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

// A stranger who knows rank 0's address sends it frames as "rank 1": with another job's
// secret, or this job's secret for another communicator. Rank 0 drops them unread; the real
// rank 1's message is the one received, and the job goes on.
TEST(FabricTransport, StrangersFramesAreDroppedAndTheJobGoesOn) {
  // Built by hand (not makeMesh) so that the strangers know rank 0's address.
  std::string a0, a1, as;
  auto t0 = fabricRank(0, 2, "test-secret", "test-comm", &a0);
  auto t1 = fabricRank(1, 2, "test-secret", "test-comm", &a1);
  auto s1 = fabricRank(1, 2, "another-secret", "test-comm", &as);
  std::string ac;
  auto s2 = fabricRank(1, 2, "test-secret", "another-comm", &ac);
  auto c0 = std::async(std::launch::async, [&] { return t0->connect({a0, a1}, soon()); });
  ASSERT_TRUE(t1->connect({a0, a1}, soon()).isOk());
  ASSERT_TRUE(c0.get().isOk());
  ASSERT_TRUE(s1->connect({a0, as}, soon()).isOk());
  ASSERT_TRUE(s2->connect({a0, ac}, soon()).isOk());
  // The strangers send first (a large one too), then the real rank 1.
  std::vector<uint8_t> junk(1 << 20, 0xee);
  const uint8_t real = 42;
  for (Transport* s : {s1.get(), s2.get()}) {
    ASSERT_TRUE(s->isend(0, collectiveEnvelope(1, 0, 1), junk.data(), 1)->wait(soon()).isOk());
    ASSERT_TRUE(
        s->isend(0, collectiveEnvelope(1, 1, 1), junk.data(), junk.size())->wait(soon()).isOk());
  }
  ASSERT_TRUE(t1->isend(0, collectiveEnvelope(1, 0, 1), &real, 1)->wait(soon()).isOk());
  uint8_t got = 0;
  const Status st = t0->irecv(1, collectiveEnvelope(1, 0, 1), &got, 1)->wait(soon());
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(got, 42);
  // Nothing of the strangers' was counted as received, and the transport still works.
  EXPECT_EQ(t0->counters()[1].bytesReceived, 1u);
  const uint8_t back = 7;
  uint8_t got1 = 0;
  auto r = t1->irecv(0, collectiveEnvelope(2, 0, 1), &got1, 1);
  ASSERT_TRUE(t0->isend(1, collectiveEnvelope(2, 0, 1), &back, 1)->wait(soon()).isOk());
  ASSERT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(got1, 7);
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
