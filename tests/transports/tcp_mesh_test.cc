// The TCP mesh's setup below the transport (handshake.h's buildMesh, address.h, layout.h):
// which interfaces become rails, the published addresses and the settings every rank shares,
// how stripes follow the rails, a refused connect dialled again, and the congestion control of
// every connection. Strangers at the door are handshake_test.cc's; the transport's own setup is
// tcp_transport_test.cc's.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "tests/transports/mesh.h"
#include "tests/transports/raw_peer.h"
#include "transports/netif.h"
#include "transports/tcp/address.h"
#include "transports/tcp/handshake.h"
#include "transports/tcp/layout.h"

namespace nanoccl::testing {
namespace {

TEST(InterfaceSpec, FollowsNcclSyntax) {
  using nanoccl::interfaceMatches;
  EXPECT_TRUE(interfaceMatches("eth0", ""));
  EXPECT_TRUE(interfaceMatches("eth0", "eth"));
  EXPECT_TRUE(interfaceMatches("ens5", "eth,ens"));
  EXPECT_FALSE(interfaceMatches("lo", "eth,ens"));
  EXPECT_FALSE(interfaceMatches("docker0", "^docker"));
  EXPECT_TRUE(interfaceMatches("eth0", "^docker"));
  EXPECT_TRUE(interfaceMatches("eth0", "=eth0"));
  EXPECT_FALSE(interfaceMatches("eth01", "=eth0"));
  EXPECT_FALSE(interfaceMatches("eth0", "^=eth0"));
  EXPECT_TRUE(interfaceMatches("eth01", "^=eth0"));
}

TEST(SocketAddress, ParsesWhatItPrints) {
  for (const std::string s : {"127.0.0.1:80", "[::1]:4242", "10.1.2.3:65535"}) {
    auto a = SocketAddress::parse(s);
    ASSERT_TRUE(a.isOk()) << s;
    EXPECT_EQ(a->toString(), s);
  }
  for (const std::string s : {"", "1.2.3.4", "1.2.3.4:0", "1.2.3.4:70000", "nohost:1", "[::1:3"}) {
    EXPECT_FALSE(SocketAddress::parse(s).isOk()) << s;
  }
}

// An interface as upInterfaces() lists it (port 0).
InterfaceAddress iface(const std::string& name, const std::string& address) {
  InterfaceAddress out{name, SocketAddress::parse(address + ":1").value()};
  out.address.setPort(0);
  return out;
}

std::vector<std::string> railNames(const std::string& spec,
                                   const std::vector<InterfaceAddress>& seen) {
  auto rails = pickRails(spec, seen);
  EXPECT_TRUE(rails.isOk()) << spec << ": " << rails.status().toString();
  std::vector<std::string> out;
  if (rails.isOk()) {
    for (const auto& r : *rails) out.push_back(r.name + "=" + r.address.toString());
  }
  return out;
}

TEST(Rails, AnIncludingListIsOneRailPerInterfaceInItsOrder) {
  const std::vector<InterfaceAddress> seen = {
      iface("lo", "127.0.0.1"),  iface("eth1", "10.0.1.1"), iface("eth0", "10.0.0.1"),
      iface("eth0", "10.0.9.9"), iface("ens5", "10.0.2.1"), iface("docker0", "172.17.0.1")};
  using V = std::vector<std::string>;
  EXPECT_EQ(railNames("eth0,eth1", seen), (V{"eth0=10.0.0.1:0", "eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("eth1,eth0", seen), (V{"eth1=10.0.1.1:0", "eth0=10.0.0.1:0"}));
  EXPECT_EQ(railNames("eth", seen), (V{"eth0=10.0.0.1:0", "eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("=eth1,ens", seen), (V{"eth1=10.0.1.1:0"}));  // '=' : exact names
  EXPECT_EQ(railNames("ens,eth0,eth", seen),
            (V{"ens5=10.0.2.1:0", "eth0=10.0.0.1:0", "eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("eth0,,eth0", seen), (V{"eth0=10.0.0.1:0"}));
  // Aliases and interfaces without a carrier are no rails; alone, the first match still is.
  auto withAlias = seen;
  withAlias.push_back(iface("eth0:1", "10.0.5.1"));
  withAlias.push_back(iface("eth2", "10.0.6.1"));
  withAlias.back().running = false;
  EXPECT_EQ(railNames("eth", withAlias), (V{"eth0=10.0.0.1:0", "eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("eth2", withAlias), (V{"eth2=10.0.6.1:0"}));
  // Excluding or empty specs keep one interface, as before rails.
  EXPECT_EQ(railNames("^docker,lo", seen), (V{"eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("", seen), (V{"eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("", {iface("lo", "127.0.0.1")}), (V{"lo=127.0.0.1:0"}));
  const auto none = pickRails("ib,eth7", seen);
  ASSERT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("'ib,eth7'"), std::string::npos);
  EXPECT_NE(none.status().message().find("eth0"), std::string::npos) << "names what is there";
}

TEST(Rails, PublishedAddressesRoundTrip) {
  auto a = tcp::parseRails("10.0.0.1:4000@1000,[::1]:4001");
  ASSERT_TRUE(a.isOk());
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[0].mbps, 1000);
  EXPECT_EQ((*a)[1].mbps, 0);  // unknown
  EXPECT_EQ(tcp::formatRails(*a), "10.0.0.1:4000@1000,[::1]:4001");
  EXPECT_EQ(tcp::parseRails("127.0.0.1:9")->size(), 1u);
  EXPECT_EQ(tcp::publishedSettings("127.0.0.1:9"), "");
  // With the settings every rank must share, after a space: parseRails() reads the rails only.
  const std::string published = tcp::formatRails(*a, "nsocks=2 encrypt=0");
  EXPECT_EQ(published, "10.0.0.1:4000@1000,[::1]:4001 nsocks=2 encrypt=0");
  ASSERT_TRUE(tcp::parseRails(published).isOk());
  EXPECT_EQ(tcp::formatRails(tcp::parseRails(published).value()), "10.0.0.1:4000@1000,[::1]:4001");
  EXPECT_EQ(tcp::publishedSettings(published), "nsocks=2 encrypt=0");
  for (const std::string s : {"", ",", "10.0.0.1:4000,", ",10.0.0.1:4000", "10.0.0.1:4000;x:1",
                              "10.0.0.1:4000@", "10.0.0.1:4000@0", "10.0.0.1:4000@-5",
                              "10.0.0.1:4000@1g", "10.0.0.1:4000@99999999999999999999",
                              " nsocks=2", "10.0.0.1:4000@ nsocks=2"}) {
    EXPECT_EQ(tcp::parseRails(s).status().code(), StatusCode::kInvalidArgument) << s;
  }
}

std::string partsText(const std::vector<Part>& parts) {
  std::string out;
  for (const Part& p : parts) {
    out += (out.empty() ? "" : " ") + std::to_string(p.lane) + ":" + std::to_string(p.offset) +
           "+" + std::to_string(p.length);
  }
  return out;
}

TEST(Rails, StripesFollowTheRailsWeights) {
  using tcp::layoutMessage;
  const auto all = OpType::kAllreduce;
  tcp::Rails equal{{1, 1}, 65536};
  // Two rails, two connections each (c % 2 is the rail): equal quarters, aligned.
  EXPECT_EQ(partsText(layoutMessage(equal, 4, all, 0, 0, 1 << 20)),
            "0:0+262144 1:262144+262144 2:524288+262144 3:786432+262144");
  // 1000 and 100 Mbit/s: the fast rail carries 10/11, the last stripe ends at the end.
  tcp::Rails unequal{{1000, 100}, 65536};
  EXPECT_EQ(partsText(layoutMessage(unequal, 2, all, 0, 0, 11 << 20)),
            "0:0+10485760 1:10485760+1048576");
  for (uint64_t total : {uint64_t{65536}, uint64_t{1000003}, uint64_t{256} << 20}) {
    for (int n : {2, 4, 6}) {
      const auto parts = layoutMessage(unequal, n, all, 7, 3, total);
      uint64_t next = 0, fast = 0;
      for (const Part& p : parts) {
        EXPECT_EQ(p.offset, next) << "every byte once, in order";
        EXPECT_GT(p.length, 0u);
        next += p.length;
        if (p.lane % 2 == 0) fast += p.length;
      }
      EXPECT_EQ(next, total);
      // Off the exact share by at most the alignment of each connection's cut.
      EXPECT_NEAR(static_cast<double>(fast), total * 10.0 / 11, n * tcp::kStripeAlign)
          << total << " on " << n;
    }
  }
  // Small messages travel whole, on the fastest rail's connections only.
  for (uint64_t seq = 0; seq < 8; ++seq) {
    const auto parts = layoutMessage(unequal, 4, all, seq, 0, 4096);
    ASSERT_EQ(parts.size(), 1u);
    EXPECT_EQ(parts[0].lane % 2, 0);
  }
  EXPECT_EQ(partsText(layoutMessage(equal, 4, all, 1, 0, 4096)), "1:0+4096");
  EXPECT_EQ(partsText(layoutMessage(unequal, 4, OpType::kSendRecv, 5, 0, 1 << 20)), "0:0+1048576");
  // Point-to-point on the fast rail even where it is not rail 0.
  tcp::Rails slowFirst{{100, 1000}, 65536};
  EXPECT_EQ(partsText(layoutMessage(slowFirst, 4, OpType::kSendRecv, 5, 0, 4096)), "1:0+4096");
  EXPECT_EQ(partsText(layoutMessage(equal, 4, all, 0, 0, 0)), "0:0+0");
  // A share that rounds to nothing leaves its connection out.
  tcp::Rails lopsided{{1000000, 1}, 4096};
  EXPECT_EQ(partsText(layoutMessage(lopsided, 2, all, 0, 0, 8192)), "0:0+8192");
}

// Two rails on loopback (two listeners of 127.0.0.1): connection s of every pair goes to the
// peer's rail s % 2 listener.
TEST(Rails, EveryRankWeighsTheRailsAlike) {
  const auto weights = [](const std::vector<std::string>& addresses, int rails) {
    auto r = tcp::weighRails(addresses, rails, 4096);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    return r.isOk() ? r->weights : std::vector<int64_t>{};
  };
  using W = std::vector<int64_t>;
  // The slowest rate any rank published, per rail; the order of the ranks does not matter.
  EXPECT_EQ(weights({"10.0.0.1:1@1000,10.0.1.1:1@100", "10.0.0.2:1@1000,10.0.1.2:1@1000"}, 2),
            (W{1000, 100}));
  EXPECT_EQ(weights({"10.0.0.2:1@1000,10.0.1.2:1@1000", "10.0.0.1:1@1000,10.0.1.1:1@100"}, 2),
            (W{1000, 100}));
  // One rank that does not know a rate: equal shares.
  EXPECT_EQ(weights({"10.0.0.1:1@1000,10.0.1.1:1", "10.0.0.2:1@1000,10.0.1.2:1@100"}, 2),
            (W{1, 1}));
  // A rank with another rail count (setup fails naming it): equal shares meanwhile.
  EXPECT_EQ(weights({"10.0.0.1:1@1000,10.0.1.1:1@100", "10.0.0.2:1@1000"}, 2), (W{1, 1}));
  EXPECT_EQ(weights({"10.0.0.1:1@1000", "10.0.0.2:1@10"}, 1), (W{1}));  // one rail: no weighing
  EXPECT_EQ(weights({""}, 1), (W{1}));  // a world of one publishes nothing
  EXPECT_EQ(tcp::weighRails({"10.0.0.1:1@1000,x", "10.0.0.2:1"}, 2, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tcp::weighRails({"10.0.0.1:1", "10.0.0.2:1"}, 1, 4096)->stripeMinBytes, 4096u);
}

TEST(Rails, ConnectionSRunsOnRailSModuloRails) {
  auto lo = iface("lo", "127.0.0.1");
  std::vector<std::vector<tcp::Listener>> listeners(2);
  std::vector<std::string> addresses;
  for (auto& l : listeners) {
    for (int rail = 0; rail < 2; ++rail) l.push_back(tcp::openListener(lo).value());
    addresses.push_back(tcp::formatRails({{l[0].address}, {l[1].address}}));
  }
  auto params = [](int rank) {
    tcp::MeshParams p{keyOf("test-secret")};
    p.rank = rank;
    p.size = 2;
    p.nsocks = 4;
    return p;
  };
  const tcp::MeshParams p0 = params(0), p1 = params(1);
  auto mesh0 = std::async(std::launch::async,
                          [&] { return tcp::buildMesh(listeners[0], addresses, p0, soon(20)); });
  auto mesh1 = tcp::buildMesh(listeners[1], addresses, p1, soon(20));
  auto links0 = mesh0.get();
  ASSERT_TRUE(links0.isOk()) << links0.status().toString();
  ASSERT_TRUE(mesh1.isOk()) << mesh1.status().toString();
  ASSERT_EQ((*links0)[1].size(), 4u);
  for (int s = 0; s < 4; ++s) {
    // Rank 0 accepted rank 1's connection s on its rail s % 2.
    SocketAddress local;
    local.length = sizeof(local.storage);
    getsockname((*links0)[1][s].fd, reinterpret_cast<sockaddr*>(&local.storage), &local.length);
    EXPECT_EQ(local.toString(), listeners[0][s % 2].address.toString()) << "connection " << s;
  }
  for (auto* links : {&*links0, &mesh1.value()}) {
    for (auto& row : *links) {
      for (auto& l : row) close(l.fd);
    }
  }
  for (auto& ls : listeners) {
    for (auto& l : ls) close(l.fd);
  }
}

TEST(Rails, RanksWithDifferentRailCountsFailAlike) {
  auto lo = iface("lo", "127.0.0.1");
  std::vector<tcp::Listener> two = {tcp::openListener(lo).value(), tcp::openListener(lo).value()};
  std::vector<tcp::Listener> one = {tcp::openListener(lo).value()};
  const std::vector<std::string> addresses = {
      tcp::formatRails({{two[0].address}, {two[1].address}}), tcp::formatRails({{one[0].address}})};
  tcp::MeshParams p{keyOf("test-secret")};
  p.size = 2;
  p.nsocks = 2;
  for (int rank : {0, 1}) {
    p.rank = rank;
    const auto mesh = tcp::buildMesh(rank == 0 ? two : one, addresses, p, soon(5));
    ASSERT_EQ(mesh.status().code(), StatusCode::kMismatch) << mesh.status().toString();
    EXPECT_NE(mesh.status().message().find("NANOCCL_SOCKET_IFNAME"), std::string::npos)
        << mesh.status().message();
    EXPECT_NE(mesh.status().message().find(rank == 0 ? "listens on 1 rail" : "listens on 2 rail"),
              std::string::npos)
        << mesh.status().message();
  }
  for (auto& l : two) close(l.fd);
  close(one[0].fd);
}

// The settings every rank must share travel in the published addresses: a rank whose settings
// differ fails setup on every rank, each naming both values, before any connection is made.
TEST(TcpSettings, ARankWhoseSettingsDifferFailsEveryRankBeforeAnyConnection) {
  auto lo = iface("lo", "127.0.0.1");
  std::vector<tcp::Listener> listeners = {tcp::openListener(lo).value(),
                                          tcp::openListener(lo).value()};
  const std::vector<std::string> addresses = {
      tcp::formatRails({{listeners[0].address}}, "nsocks=2 stripe_min_bytes=65536 encrypt=0"),
      tcp::formatRails({{listeners[1].address}}, "nsocks=3 stripe_min_bytes=65536 encrypt=0")};
  tcp::MeshParams p{keyOf("test-secret")};
  p.size = 2;
  p.nsocks = 2;
  for (int rank : {0, 1}) {
    p.rank = rank;
    const auto mesh = tcp::buildMesh({listeners[rank]}, addresses, p, soon(5));
    ASSERT_EQ(mesh.status().code(), StatusCode::kMismatch) << mesh.status().toString();
    for (const char* named : {"nsocks=2", "nsocks=3", rank == 0 ? "rank 1" : "rank 0"}) {
      EXPECT_NE(mesh.status().message().find(named), std::string::npos) << mesh.status().message();
    }
  }
  // Rank 1 never connected: no connection waits at rank 0's listener (nor at its own).
  for (const tcp::Listener& l : listeners) {
    pollfd pf{l.fd, POLLIN, 0};
    EXPECT_EQ(poll(&pf, 1, 100), 0) << "a connection was made to " << l.address.toString();
    close(l.fd);
  }
}

// A rank that dials before its peer listens (a restarted peer, a slow interface) is refused,
// and dials again until the deadline: rank 1's connections are refused while nothing listens
// at rank 0's address; once rank 0 listens there, the mesh is built.
// A socket bound to a port of `lo` that does not listen (yet): connects to it are refused, and no
// one else can take the port.
tcp::Listener boundNotListening(const InterfaceAddress& lo) {
  tcp::Listener l{socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), "lo", lo.address};
  l.address.setPort(0);
  EXPECT_EQ(bind(l.fd, reinterpret_cast<const sockaddr*>(&l.address.storage), l.address.length), 0)
      << strerror(errno);
  l.address.length = sizeof(l.address.storage);
  getsockname(l.fd, reinterpret_cast<sockaddr*>(&l.address.storage), &l.address.length);
  return l;
}

// Rank 1 of a pair (two sockets) on `lo` whose rank 0 is at `l0`: its listener, both ranks'
// published addresses, its parameters.
struct SecondRank {
  std::vector<tcp::Listener> listeners;
  std::vector<std::string> addresses;
  tcp::MeshParams params;
};
SecondRank secondRank(const InterfaceAddress& lo, const tcp::Listener& l0) {
  SecondRank r{{tcp::openListener(lo).value()}, {}, tcp::MeshParams{keyOf("test-secret")}};
  r.addresses = {tcp::formatRails({{l0.address}}), tcp::formatRails({{r.listeners[0].address}})};
  r.params.size = 2;
  r.params.nsocks = 2;
  r.params.rank = 1;
  return r;
}

TEST(TcpSetup, ARefusedConnectIsDialledAgain) {
  auto lo = iface("lo", "127.0.0.1");
  tcp::Listener l0 = boundNotListening(lo);  // rank 0's port, listening later
  SecondRank one = secondRank(lo, l0);
  const std::vector<tcp::Listener>& l1 = one.listeners;
  const std::vector<std::string>& addresses = one.addresses;
  const tcp::MeshParams& p = one.params;
  auto mesh1 = std::async(std::launch::async,
                          [&] { return tcp::buildMesh(l1, addresses, p, soon(20)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(mesh1.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << mesh1.get().status().toString();
  ASSERT_EQ(listen(l0.fd, 16), 0);
  tcp::MeshParams p0 = p;
  p0.rank = 0;
  auto mesh0 = tcp::buildMesh({l0}, addresses, p0, soon(20));
  auto links1 = mesh1.get();
  ASSERT_TRUE(mesh0.isOk()) << mesh0.status().toString();
  ASSERT_TRUE(links1.isOk()) << links1.status().toString();
  EXPECT_EQ((*links1)[0].size(), 2u);
  for (auto* links : {&mesh0.value(), &links1.value()}) {
    for (auto& row : *links) {
      for (auto& l : row) close(l.fd);
    }
  }
  close(l0.fd);
  close(l1[0].fd);
}

// A setup that times out says why this rank's own connects did not get through: the last one
// refused (rank 0's port bound, never listening), or one never answered (rank 0 listens, but its
// accept queue is full and the kernel drops the SYNs).
TEST(TcpSetup, ATimeoutSaysWhyTheConnectsDidNotGetThrough) {
  auto lo = iface("lo", "127.0.0.1");
  for (const bool listening : {false, true}) {
    tcp::Listener l0 = boundNotListening(lo);
    std::vector<int> fillers;
    if (listening) {
      ASSERT_EQ(listen(l0.fd, 0), 0);
      for (int k = 0; k < 2; ++k) {  // fill the accept queue, which then drops SYNs
        fillers.push_back(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
        connect(fillers.back(), reinterpret_cast<const sockaddr*>(&l0.address.storage),
                l0.address.length);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    SecondRank one = secondRank(lo, l0);
    auto mesh = tcp::buildMesh(one.listeners, one.addresses, one.params,
                               Deadline::after(std::chrono::milliseconds(700)));
    ASSERT_FALSE(mesh.isOk());
    EXPECT_EQ(mesh.status().code(), StatusCode::kTimeout) << mesh.status().toString();
    const std::string msg = mesh.status().message();
    const std::string rank0 = "rank 0 at " + l0.address.toString();
    if (listening) {
      EXPECT_NE(msg.find("no answer to the connect to " + rank0), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("the last connect failed: " + rank0 + ": Connection refused"),
                std::string::npos) << msg;
    }
    for (int fd : fillers) close(fd);
    close(l0.fd);
    close(one.listeners[0].fd);
  }
}

// NANOCCL_TCP_CONGESTION: every connection of the mesh, connected and accepted, runs the
// algorithm asked for; one the kernel does not have fails listen() on that rank, naming the
// setting and what the host allows.
TEST(TcpCongestion, EveryConnectionRunsItAndAnUnknownOneIsNamed) {
  auto lo = iface("lo", "127.0.0.1");
  std::vector<tcp::Listener> listeners = {tcp::openListener(lo).value(),
                                          tcp::openListener(lo).value()};
  const std::vector<std::string> addresses = {tcp::formatRails({{listeners[0].address}}),
                                              tcp::formatRails({{listeners[1].address}})};
  auto params = [](int rank) {
    tcp::MeshParams p{keyOf("test-secret")};
    p.rank = rank;
    p.size = 2;
    p.nsocks = 2;
    p.tcpCongestion = "reno";  // built into every Linux kernel and allowed by default
    return p;
  };
  const tcp::MeshParams p0 = params(0), p1 = params(1);
  auto mesh0 = std::async(std::launch::async, [&] {
    return tcp::buildMesh({listeners[0]}, addresses, p0, soon(20));
  });
  auto mesh1 = tcp::buildMesh({listeners[1]}, addresses, p1, soon(20));
  auto links0 = mesh0.get();
  ASSERT_TRUE(links0.isOk()) << links0.status().toString();
  ASSERT_TRUE(mesh1.isOk()) << mesh1.status().toString();
  for (const auto& link : {(*links0)[1][0], (*links0)[1][1], (*mesh1)[0][0], (*mesh1)[0][1]}) {
    char name[16] = {};
    socklen_t len = sizeof(name);
    ASSERT_EQ(getsockopt(link.fd, IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
    EXPECT_STREQ(name, "reno");
  }
  for (auto* links : {&*links0, &mesh1.value()}) {
    for (auto& row : *links) {
      for (auto& l : row) close(l.fd);
    }
  }
  for (auto& l : listeners) close(l.fd);

  Config cfg = loopbackConfig("epoll", 1);
  ASSERT_TRUE(cfg.set("tcp_congestion", "nosuchcc").isOk());  // well formed, not a kernel's
  auto t = createTransport("tcp", optionsFor(0, 2, cfg)).value();
  const auto listened = t->listen();
  ASSERT_EQ(listened.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(listened.status().message().find("NANOCCL_TCP_CONGESTION=nosuchcc"),
            std::string::npos) << listened.status().message();
  EXPECT_NE(listened.status().message().find("this host allows: "), std::string::npos)
      << listened.status().message();
}

// NANOCCL_TCP_CONGESTION=auto leaves the host's default unless it is BBR, which it replaces by
// cubic (or reno); "host" leaves BBR too; a name is set as it is. The listener's algorithm
// stands in for the host's default here (chooseCongestionControl reads the socket's own).
TEST(TcpCongestion, AutoReplacesBbrAndKeepsAnyOtherDefault) {
  auto lo = iface("lo", "127.0.0.1");
  tcp::Listener l = tcp::openListener(lo).value();
  auto running = [&] {
    char name[16] = {};
    socklen_t len = sizeof(name) - 1;
    EXPECT_EQ(getsockopt(l.fd, IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
    return std::string(name);
  };
  ASSERT_TRUE(tcp::setCongestionControl(l.fd, "reno").isOk());
  EXPECT_EQ(tcp::chooseCongestionControl(l.fd, "auto").value(), "");  // not BBR: kept
  EXPECT_EQ(running(), "reno");
  EXPECT_EQ(tcp::chooseCongestionControl(l.fd, "host").value(), "");
  EXPECT_EQ(running(), "reno");
  const auto bad = tcp::chooseCongestionControl(l.fd, "nosuchcc");
  ASSERT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("NANOCCL_TCP_CONGESTION=nosuchcc"), std::string::npos);

  const bool haveBbr = tcp::setCongestionControl(l.fd, "bbr").isOk();
  if (haveBbr) {
    EXPECT_EQ(tcp::chooseCongestionControl(l.fd, "host").value(), "");
    EXPECT_EQ(running(), "bbr");
    auto chosen = tcp::chooseCongestionControl(l.fd, "auto");
    ASSERT_TRUE(chosen.isOk()) << chosen.status().toString();
    EXPECT_TRUE(*chosen == "cubic" || *chosen == "reno") << *chosen;
    EXPECT_EQ(running(), *chosen);
    EXPECT_EQ(tcp::chooseCongestionControl(l.fd, "bbr").value(), "bbr");  // asked for by name
    EXPECT_EQ(running(), "bbr");
  }
  close(l.fd);
  if (!haveBbr) GTEST_SKIP() << "this kernel has no bbr: the BBR half was not run";
}

}  // namespace
}  // namespace nanoccl::testing
