// A raw peer for tests: plays the connecting side of the TCP handshake (transports/tcp/
// wire.h) over a plain socket, as a stranger, an impostor or a replayer would.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>

#include "common/crypto.h"
#include "common/secret.h"
#include "transports/frame.h"
#include "transports/tcp/address.h"
#include "transports/tcp/wire.h"

namespace nanoccl::testing {

// Connects to the first rail of a rank's published address (address.h) or a plain address.
inline int dial(const std::string& address) {
  auto rails = tcp::parseRails(address);
  EXPECT_TRUE(rails.isOk()) << address;
  if (!rails.isOk()) return -1;
  const SocketAddress& a = rails->front().address;
  const int fd = socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length), 0);
  return fd;
}

// What a fake peer at `rails` publishes: those rails with the settings of `real` (a real
// rank's published address), so that the real rank's setup goes on to connect.
inline std::string publishedLike(const std::string& rails, const std::string& real) {
  const std::string settings = tcp::publishedSettings(real);
  return settings.empty() ? rails : rails + " " + settings;
}

// Whether the other side closed `fd` within `ms` (a read returns 0 or an error).
// A listening socket on 127.0.0.1 with a port the kernel picks, for a fake peer or a proxy;
// `address` is its rail (publishedLike() makes it what a rank would publish).
inline int listenLoopback(std::string* address) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  return fd;
}

inline bool closedByPeer(int fd, int ms = 5000) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return false;
  char b[256];
  return recv(fd, b, sizeof(b), 0) <= 0;
}

// A member's identity (transports/identity.h) for `secret` in communicator `commId`.
inline CommIdentity keyOf(const std::string& secret, const std::string& commId = "test-comm") {
  return CommIdentity(secret, commId);
}

inline tcp::Hello helloFor(int rank, int size, int socket = 0,
                           const std::string& commId = "test-comm") {
  tcp::Hello h{};
  h.magic = kMagic;
  h.version = tcp::kHandshakeVersion;
  h.socketIndex = static_cast<uint16_t>(socket);
  h.rank = rank;
  h.size = size;
  h.commIdHash = hashCommId(commId);
  EXPECT_TRUE(crypto::randomBytes(h.nonce, sizeof(h.nonce)).isOk());
  return h;
}

inline bool sendAll(int fd, const void* p, size_t n) {
  return send(fd, p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

inline bool recvAll(int fd, void* p, size_t n, int ms = 5000) {
  pollfd pf{fd, POLLIN, 0};
  if (poll(&pf, 1, ms) <= 0) return false;
  return recv(fd, p, n, MSG_WAITALL) == static_cast<ssize_t>(n);
}

// What a raw connector saw of the handshake it played (handshake()).
struct Played {
  bool acceptorProved = false;   // the Challenge's MAC verified under our key
  std::optional<tcp::HelloAck> ack;   // none: the acceptor closed the connection instead
  std::string sent;              // every byte we sent (Hello, Proof), for replays
};

// Plays the connector's side of the handshake on `fd` under `key`: Hello, Challenge, Proof,
// HelloAck. A `replay` of an earlier transcript is sent instead of a fresh Hello and Proof.
inline Played handshake(int fd, const tcp::Hello& h, const CommIdentity& key,
                 const std::string& replay = "") {
  Played out;
  const std::string hello = replay.empty() ? std::string(reinterpret_cast<const char*>(&h),
                                                         sizeof(h))
                                           : replay.substr(0, sizeof(tcp::Hello));
  if (!sendAll(fd, hello.data(), hello.size())) return out;
  out.sent += hello;
  tcp::Challenge c{};
  if (!recvAll(fd, &c, sizeof(c))) return out;
  tcp::Hello sentHello;
  std::memcpy(&sentHello, hello.data(), sizeof(sentHello));
  const crypto::Mac expected = tcp::challengeMac(key, sentHello, c);
  out.acceptorProved = crypto::equalConstantTime(expected.data(), c.mac, expected.size());
  tcp::Proof proof{};
  proof.magic = kMagic;
  const crypto::Mac mac = tcp::proofMac(key, sentHello, c);
  std::memcpy(proof.mac, mac.data(), mac.size());
  std::string p(reinterpret_cast<const char*>(&proof), sizeof(proof));
  if (!replay.empty()) p = replay.substr(sizeof(tcp::Hello), sizeof(tcp::Proof));
  if (!sendAll(fd, p.data(), p.size())) return out;
  out.sent += p;
  tcp::HelloAck ack{};
  if (recvAll(fd, &ack, sizeof(ack))) out.ack = ack;
  return out;
}

}  // namespace nanoccl::testing
