// What is particular to the libfabric transport (the contract itself, with strangers, garbage
// and ranks of another secret or communicator, is conformance_test.cc): addresses that are not
// fabric addresses are refused, encryption is refused rather than silently left out, and an
// FI_PROVIDER libfabric does not have is a clear error.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// Runs the shell command `cmd` (its stderr with its stdout): its exit status and output.
std::pair<int, std::string> runCommand(const std::string& cmd) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 512> buf{};
  while (f != nullptr && std::fgets(buf.data(), buf.size(), f) != nullptr) out += buf.data();
  const int rc = f != nullptr ? pclose(f) : -1;
  return {rc, out};
}

// FI_PROVIDER is read by libfabric at its first use in a process, and the library is loaded
// then: the check runs in a fresh one (fabric_probe), with `env` before it.
std::pair<int, std::string> probe(const std::string& provider, const std::string& env = "") {
  return runCommand(env + " FI_PROVIDER='" + provider + "' " + NANOCCL_FABRIC_PROBE);
}

// Two ranks in their own processes, each with `env` (FI_OFI_RXM_* is read at libfabric's
// first use); their outputs, rank 0's first.
std::pair<std::string, std::string> pairOfProbes(const std::string& env0,
                                                 const std::string& env1) {
  char dir[] = "/tmp/nanoccl-fabric-pair-XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  auto run = [&](int rank, const std::string& env) {
    return runCommand(env + " " + NANOCCL_FABRIC_PROBE + " " + std::to_string(rank) + " " + dir)
        .second;
  };
  auto r0 = std::async(std::launch::async, run, 0, env0);
  const std::string out1 = run(1, env1);
  const std::string out0 = r0.get();
  std::system((std::string("rm -rf ") + dir).c_str());
  return {out0, out1};
}

// Frames follow rxm's eager size (FI_OFI_RXM_BUFFER_SIZE): another value than the default works
// when every rank has it, and ranks that differ fail setup naming the setting (rxm does not
// connect them; another provider would deliver the greeting, which names it too).
TEST(FabricTransport, FramesFollowTheEagerSizeAndRanksMustAgreeOnIt) {
  const auto same = pairOfProbes("FI_OFI_RXM_BUFFER_SIZE=32768", "FI_OFI_RXM_BUFFER_SIZE=32768");
  EXPECT_NE(same.first.find("delivered"), std::string::npos) << same.first;
  EXPECT_NE(same.second.find("delivered"), std::string::npos) << same.second;
  const auto differ = pairOfProbes("FI_OFI_RXM_BUFFER_SIZE=65536", "FI_OFI_RXM_BUFFER_SIZE=32768");
  for (const std::string& out : {differ.first, differ.second}) {
    EXPECT_EQ(out.find("delivered"), std::string::npos) << out;
    EXPECT_NE(out.find("FI_OFI_RXM_BUFFER_SIZE"), std::string::npos) << out;
  }
}

TEST(FabricTransport, AnUnknownProviderIsAClearErrorNotAFallBack) {
  const auto [rc, out] = probe("nosuchprovider");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("FI_PROVIDER=nosuchprovider"), std::string::npos) << out;
  // The default provider works where the bad one failed.
  const auto [ok, text] = probe("tcp;ofi_rxm");
  EXPECT_EQ(ok, 0) << text;
}

// libfabric is loaded when the first fabric transport opens (transports/fabric/libfabric.h): a
// library that does not load, or lacks libfabric's functions, is an error that says so.
TEST(FabricTransport, ALibfabricThatCannotBeUsedIsAClearError) {
  char dir[] = "/tmp/nanoccl-libfabric-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::FILE* f = std::fopen((std::string(dir) + "/libfabric.so.1").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("not a shared object", f);
  std::fclose(f);
  const auto [rc, out] = probe("tcp;ofi_rxm", std::string("LD_LIBRARY_PATH=") + dir);
  std::system((std::string("rm -rf ") + dir).c_str());
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("cannot load libfabric"), std::string::npos) << out;
  const auto [rc2, out2] =
      probe("tcp;ofi_rxm", std::string("LD_LIBRARY_PATH=") + NANOCCL_STUB_LIBFABRIC_DIR);
  EXPECT_NE(rc2, 0) << out2;
  EXPECT_NE(out2.find("libfabric.so.1 lacks fi_getinfo"), std::string::npos) << out2;
}

}  // namespace
}  // namespace nanoccl::testing
