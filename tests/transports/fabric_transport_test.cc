// What is particular to the libfabric transport (the contract itself, with strangers, garbage
// and ranks of another secret or communicator, is conformance_test.cc): addresses that are not
// fabric addresses are refused, encryption is refused rather than silently left out, and an
// FI_PROVIDER libfabric does not have is a clear error.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
