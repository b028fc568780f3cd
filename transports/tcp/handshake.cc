#include "transports/tcp/handshake.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/logging.h"
#include "transports/tcp/wire.h"

namespace nanoccl::tcp {
namespace {

// Most half-open connections we keep while waiting for Hellos; more are closed at once, so a
// flood of strangers cannot exhaust descriptors.
constexpr size_t kMaxPendingIncoming = 256;
// A peer that hangs up one of our connections mid-handshake may have told us why on another:
// a rank that finds our settings differ answers the first connection with a verdict, then fails
// and closes the rest. The close is reported only once the peer's other connections have
// answered or closed too, or after this long (within the setup deadline).
constexpr std::chrono::milliseconds kHangUpGrace{250};

// Every connection: no Nagle delay, and the congestion control asked for (if any).
Status tuneSocket(int fd, const std::string& congestion) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return congestion.empty() ? Status::ok() : setCongestionControl(fd, congestion);
}

}  // namespace

Status setCongestionControl(int fd, const std::string& name) {
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), name.size()) == 0) {
    return Status::ok();
  }
  const int err = errno;
  std::string allowed;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_allowed_congestion_control", "r")) {
    char line[256] = {};
    if (std::fgets(line, sizeof(line), f) != nullptr) allowed = line;
    std::fclose(f);
    while (!allowed.empty() && (allowed.back() == '\n' || allowed.back() == ' ')) {
      allowed.pop_back();
    }
  }
  return invalidArgument("NANOCCL_TCP_CONGESTION=" + name + ": the kernel refused it (" +
                         std::strerror(err) + "); this host allows: " +
                         (allowed.empty() ? std::string("?") : allowed) +
                         " (/proc/sys/net/ipv4/tcp_allowed_congestion_control)");
}

Result<std::string> chooseCongestionControl(int fd, const std::string& setting) {
  if (setting.empty() || setting == "host") return std::string();
  if (setting != "auto") {
    NANOCCL_CHECK(setCongestionControl(fd, setting));
    return setting;
  }
  char current[16] = {};  // TCP_CA_NAME_MAX
  socklen_t len = sizeof(current) - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, current, &len) != 0) {
    return systemError("getsockopt(TCP_CONGESTION)", errno);
  }
  if (std::string(current).rfind("bbr", 0) != 0) return std::string();  // bbr, bbr2, bbr3...
  for (const char* instead : {"cubic", "reno"}) {
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, instead, std::strlen(instead)) == 0) {
      return std::string(instead);
    }
  }
  NANOCCL_WARN("NANOCCL_TCP_CONGESTION=auto: the host's default is " << current
               << " and the kernel refused cubic and reno; the connections keep it");
  return std::string();
}

namespace {

std::string peerName(int fd) {
  SocketAddress a;
  a.length = sizeof(a.storage);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.length) != 0) return "?";
  return a.toString();
}

// One connection being set up. Outgoing: send Hello, read Challenge, send Proof, read
// HelloAck. Incoming: read Hello, send Challenge, read Proof, send HelloAck.
struct Pending {
  enum class Stage { kConnecting, kSending, kReceiving } stage;
  bool outgoing;
  int phase = 0;    // records received so far
  int fd;
  int peer;         // outgoing: target rank; incoming: known after the Proof
  int socketIndex;  // outgoing: which connection; incoming: known after the Proof
  static constexpr size_t kMaxRecord = sizeof(Hello);
  char out[kMaxRecord];
  size_t outLen = 0;
  size_t outDone = 0;
  char in[kMaxRecord];
  size_t inLen = 0;
  size_t inDone = 0;
  Hello hello{};          // as the connector sent it
  Challenge challenge{};  // as the acceptor sent it
  Clock::time_point retryAt{};  // outgoing: reconnect after a refusal
};
static_assert(Pending::kMaxRecord >= sizeof(Challenge) && Pending::kMaxRecord >= sizeof(Proof) &&
              Pending::kMaxRecord >= sizeof(HelloAck));

template <typename T>
void setOut(Pending& pc, const T& record) {
  std::memcpy(pc.out, &record, sizeof(T));
  pc.outLen = sizeof(T);
  pc.outDone = 0;
}

template <typename T>
void expectIn(Pending& pc) {
  pc.inLen = sizeof(T);
  pc.inDone = 0;
}

// The next exchange of the handshake: send `record`, then read a `Reply`.
template <typename Reply, typename T>
void sendThenRead(Pending& pc, const T& record) {
  setOut(pc, record);
  expectIn<Reply>(pc);
  pc.stage = Pending::Stage::kSending;
}

std::string encryptionText(uint32_t flags) {
  return (flags & kHelloEncrypt) != 0 ? "encrypt=1" : "encrypt=0";
}

class MeshBuilder {
 public:
  MeshBuilder(const std::vector<Listener>& listeners, const std::vector<std::string>& addresses,
              const MeshParams& p)
      : listeners_(listeners), addresses_(addresses), p_(p) {
    links_.assign(static_cast<size_t>(p.size), {});
    for (int r = 0; r < p.size; ++r) {
      if (r != p.rank) links_[r].assign(static_cast<size_t>(p.nsocks), MeshLink{});
    }
  }

  ~MeshBuilder() {
    for (auto& pc : pending_) {
      if (pc.fd >= 0) close(pc.fd);
    }
    if (!success_) {
      for (auto& row : links_) {
        for (const MeshLink& l : row) {
          if (l.fd >= 0) close(l.fd);
        }
      }
    }
  }

  Result<std::vector<std::vector<MeshLink>>> run(const Deadline& deadline) {
    NANOCCL_CHECK(readTargets());
    for (int peer = 0; peer < p_.rank; ++peer) {
      for (int s = 0; s < p_.nsocks; ++s) NANOCCL_CHECK(startConnect(peer, s));
    }
    expectedIncoming_ = (p_.size - 1 - p_.rank) * p_.nsocks;
    const size_t nListeners = listeners_.size();
    while (!done()) {
      if (!hungUp_.isOk() && (Clock::now() >= hungUpReportAt_ || !outgoingPendingTo(hungUpPeer_))) {
        return hungUp_;
      }
      if (deadline.expired()) return hungUp_.isOk() ? timeoutError(describeMissing()) : hungUp_;
      std::vector<pollfd> pfds;
      for (const Listener& l : listeners_) pfds.push_back({l.fd, POLLIN, 0});
      for (auto& pc : pending_) {
        short ev = 0;
        if (pc.stage == Pending::Stage::kConnecting || pc.stage == Pending::Stage::kSending) {
          ev = POLLOUT;
        } else if (pc.stage == Pending::Stage::kReceiving) {
          ev = POLLIN;
        }
        pfds.push_back({pc.fd, ev, 0});
      }
      const int n = ::poll(pfds.data(), pfds.size(), deadline.remainingMs(50));
      if (n < 0 && errno != EINTR) return systemError("poll", errno);
      for (size_t i = 0; i < nListeners; ++i) {
        if (pfds[i].revents & POLLIN) NANOCCL_CHECK(acceptAll(listeners_[i].fd));
      }
      for (size_t i = nListeners; i < pfds.size(); ++i) {
        if (pfds[i].revents != 0) NANOCCL_CHECK(step(pending_[i - nListeners]));
      }
      NANOCCL_CHECK(retryRefused());
      // Forget finished and dropped connections.
      std::erase_if(pending_, [](const Pending& pc) { return pc.fd < 0; });
    }
    success_ = true;
    return std::move(links_);
  }

 private:
  bool done() const { return outgoingDone_ == p_.rank * p_.nsocks && incomingDone_ == expectedIncoming_; }

  bool outgoingPendingTo(int peer) const {
    return std::any_of(pending_.begin(), pending_.end(), [peer](const Pending& pc) {
      return pc.outgoing && pc.peer == peer && pc.fd >= 0;
    });
  }

  // An outgoing connection the peer closed mid-handshake: the setup fails with `why` unless
  // another connection to that peer says why first (kHangUpGrace).
  Status hangUp(Pending& pc, const std::string& why) {
    close(pc.fd);
    pc.fd = -1;
    if (hungUp_.isOk()) {
      hungUp_ = peerError(why);
      hungUpPeer_ = pc.peer;
      hungUpReportAt_ = Clock::now() + kHangUpGrace;
    }
    return Status::ok();
  }

  int rails() const { return static_cast<int>(listeners_.size()); }

  // A Hello's connection count as the setting it comes from: NANOCCL_NSOCKS is a rail's (the
  // ranks' rail counts agree by now: readTargets()).
  std::string nsocksText(uint32_t connections) const {
    if (rails() == 1) return "nsocks=" + std::to_string(connections);
    return "nsocks=" + std::to_string(connections / rails()) + "/rail (x" +
           std::to_string(rails()) + " rails)";
  }

  // Every rank's rails (targets_[rank]), and the same count everywhere: each rank reads the
  // same addresses, so a rank with fewer interfaces fails every rank alike.
  Status readTargets() {
    for (int r = 0; r < p_.size; ++r) {
      if (r == p_.rank) {
        targets_.emplace_back();
        continue;
      }
      Result<std::vector<RailAddress>> published = parseRails(addresses_[r]);
      if (!published.isOk()) {
        return published.status().withContext("rank " + std::to_string(p_.rank) + ": rank " +
                                               std::to_string(r) + "'s published address: ");
      }
      targets_.emplace_back();
      for (const RailAddress& rail : *published) targets_[r].push_back(rail.address);
      if (static_cast<int>(targets_[r].size()) != rails()) {
        return mismatchError(
            "rank " + std::to_string(p_.rank) + ": rank " + std::to_string(r) + " listens on " +
            std::to_string(targets_[r].size()) + " rail(s) (" + addresses_[r] + "), this rank on " +
            std::to_string(rails()) + " (" + describeRails() +
            "); NANOCCL_SOCKET_IFNAME (and NANOCCL_RAIL_PER_LOCAL_RANK) must select as many "
            "interfaces on every rank, rail k of each on the same network");
      }
      for (int k = 0; k < rails(); ++k) {
        if (targets_[r][k].family() != listeners_[k].address.family()) {
          return mismatchError("rank " + std::to_string(p_.rank) + ": rail " +
                               std::to_string(k) + " is " + listeners_[k].address.toString() +
                               " via " + listeners_[k].ifname + " here but " +
                               targets_[r][k].toString() + " on rank " + std::to_string(r) +
                               ": one IPv4 and one IPv6; rail k of every rank must be on the "
                               "same network (NANOCCL_SOCKET_IFNAME)");
        }
      }
    }
    return Status::ok();
  }

  std::string describeRails() const {
    std::string out;
    for (const Listener& l : listeners_) {
      if (!out.empty()) out += ", ";
      out += l.address.toString();
      out += " via ";
      out += l.ifname;
    }
    return out;
  }

  std::string describeMissing() const {
    std::string missing;
    std::vector<bool> railMissing(static_cast<size_t>(rails()), false);
    for (int r = 0; r < p_.size; ++r) {
      if (r == p_.rank) continue;
      bool listed = false;
      for (int s = 0; s < p_.nsocks; ++s) {
        if (links_[r][s].fd >= 0) continue;
        railMissing[static_cast<size_t>(s % rails())] = true;
        if (!listed) missing += std::string(missing.empty() ? "" : ", ") + std::to_string(r);
        listed = true;
      }
    }
    // With several rails, which ones lack connections: a rail down, or not one network.
    std::string onRails;
    if (rails() > 1) {
      for (int k = 0; k < rails(); ++k) {
        if (!railMissing[static_cast<size_t>(k)]) continue;
        onRails += onRails.empty() ? " on rail(s) " : ", ";
        onRails += listeners_[static_cast<size_t>(k)].ifname;
      }
    }
    return "rank " + std::to_string(p_.rank) + ": connection setup timed out waiting for rank(s) " +
           missing + onRails + " (listening on " + describeRails() +
           "; check NANOCCL_SOCKET_IFNAME and that every rank started" +
           (rejection_.empty() ? "" : "; last connection turned away: " + rejection_) +
           ")";
  }

  Status startConnect(int peer, int socketIndex) {
    const int rail = socketIndex % rails();
    const SocketAddress& target = targets_[peer][rail];
    const int fd = socket(target.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return systemError("socket", errno);
    if (Status st = tuneSocket(fd, p_.tcpCongestion); !st.isOk()) {
      close(fd);
      return st;
    }
    if (rails() > 1) {
      // Leave from the rail's own address (its port picked at connect time), so that a host
      // routing by source address sends it out of that interface.
      const int one = 1;
      setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
      SocketAddress local = listeners_[rail].address;
      local.setPort(0);
      if (bind(fd, reinterpret_cast<const sockaddr*>(&local.storage), local.length) != 0) {
        const int err = errno;
        close(fd);
        return systemError(("bind to " + local.toString() + " (rail " + std::to_string(rail) +
                            ", " + listeners_[rail].ifname + ")").c_str(), err);
      }
    }
    Pending pc{};
    pc.stage = Pending::Stage::kConnecting;
    pc.outgoing = true;
    pc.fd = fd;
    pc.peer = peer;
    pc.socketIndex = socketIndex;
    Hello& h = pc.hello;
    h.magic = kMagic;
    h.version = kHandshakeVersion;
    h.socketIndex = static_cast<uint16_t>(socketIndex);
    h.rank = p_.rank;
    h.size = p_.size;
    h.nsocks = p_.nsocks;
    h.flags = p_.encrypt ? kHelloEncrypt : 0;
    h.commIdHash = p_.identity.commHash();
    h.stripeMinBytes = p_.stripeMinBytes;
    if (Status st = crypto::randomBytes(h.nonce, sizeof(h.nonce)); !st.isOk()) {
      close(fd);
      return st;
    }
    setOut(pc, h);
    expectIn<Challenge>(pc);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&target.storage), target.length) == 0) {
      pc.stage = Pending::Stage::kSending;
    } else if (errno != EINPROGRESS) {
      const int err = errno;
      close(fd);
      return systemError(("connect to rank " + std::to_string(peer) + " at " +
                          target.toString()).c_str(), err);
    }
    pending_.push_back(pc);
    return Status::ok();
  }

  Status retryRefused() {
    const auto now = Clock::now();
    for (auto& [peer, socketIndex, at] : refused_) {
      if (peer >= 0 && now >= at) {
        NANOCCL_CHECK(startConnect(peer, socketIndex));
        peer = -1;
      }
    }
    std::erase_if(refused_, [](const auto& r) { return std::get<0>(r) < 0; });
    return Status::ok();
  }

  Status acceptAll(int listenFd) {
    while (true) {
      const int fd = accept4(listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::ok();
        if (errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) return Status::ok();
        return systemError("accept4", errno);
      }
      size_t incoming = 0;
      for (const auto& pc : pending_) incoming += pc.outgoing ? 0 : 1;
      if (incoming >= kMaxPendingIncoming) {
        NANOCCL_WARN("rank " << p_.rank << ": too many unauthenticated connections; closing one");
        close(fd);
        continue;
      }
      // Accepted sockets inherit the listener's congestion control (set in listen()); setting it
      // again cannot fail where that succeeded.
      (void)tuneSocket(fd, p_.tcpCongestion);
      Pending pc{};
      pc.stage = Pending::Stage::kReceiving;
      pc.outgoing = false;
      pc.fd = fd;
      pc.peer = -1;
      pc.socketIndex = -1;
      expectIn<Hello>(pc);
      pending_.push_back(pc);
    }
  }

  // Closes a connection that did not get in. `why` names a cause (a wrong secret, another
  // communicator) unless `bare` (a peer that hung up): the timeout's message keeps the latest
  // cause, which a bare close never overwrites; a rank with another secret hangs up its other
  // connections too, and those may reach us first or last.
  void drop(Pending& pc, const std::string& why, bool bare = false) {
    const std::string rejection = peerName(pc.fd) + ": " + why;
    if (!bare || !rejectionNamesCause_) {
      rejection_ = rejection;
      rejectionNamesCause_ = !bare;
    }
    NANOCCL_WARN("rank " << p_.rank << ": rejected a connection from " << rejection);
    close(pc.fd);
    pc.fd = -1;
  }

  std::string outgoingWho(const Pending& pc) const {
    return "rank " + std::to_string(p_.rank) + ": rank " + std::to_string(pc.peer) + " at " +
           targets_[pc.peer][pc.socketIndex % rails()].toString();
  }

  Status step(Pending& pc) {
    if (pc.stage == Pending::Stage::kConnecting) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(pc.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == EINPROGRESS) return Status::ok();
      if (err != 0) {
        // The peer listens before it publishes its address, so a refusal is transient (a
        // restarted job, a slow interface); retry until the deadline, as NCCL does.
        close(pc.fd);
        pc.fd = -1;
        refused_.emplace_back(pc.peer, pc.socketIndex,
                              Clock::now() + std::chrono::milliseconds(20));
        return Status::ok();
      }
      pc.stage = Pending::Stage::kSending;
    }
    if (pc.stage == Pending::Stage::kSending) {
      while (pc.outDone < pc.outLen) {
        const ssize_t n = ::send(pc.fd, pc.out + pc.outDone, pc.outLen - pc.outDone, MSG_NOSIGNAL);
        if (n > 0) {
          pc.outDone += static_cast<size_t>(n);
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
          return Status::ok();
        } else if (pc.outgoing) {
          return hangUp(pc, outgoingWho(pc) + " closed the connection during setup");
        } else {
          drop(pc, "closed before our answer was sent", /*bare=*/true);
          return Status::ok();
        }
      }
      if (!pc.outgoing && pc.phase == 2) {  // the HelloAck is out
        finishIncoming(pc);
        return Status::ok();
      }
      pc.stage = Pending::Stage::kReceiving;
    }
    if (pc.stage == Pending::Stage::kReceiving) {
      while (pc.inDone < pc.inLen) {
        const ssize_t n = ::recv(pc.fd, pc.in + pc.inDone, pc.inLen - pc.inDone, 0);
        if (n > 0) {
          pc.inDone += static_cast<size_t>(n);
          // Reject garbage as soon as the magic is in, without waiting for the rest.
          if (!pc.outgoing && pc.inDone >= sizeof(uint32_t)) {
            uint32_t magic;
            std::memcpy(&magic, pc.in, sizeof(magic));
            if (magic != kMagic) {
              drop(pc, "not a nanoccl handshake (bad magic)");
              return Status::ok();
            }
          }
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
          return Status::ok();
        } else if (pc.outgoing) {
          return hangUp(pc, outgoingWho(pc) +
                                " closed the connection during the handshake (is it running a "
                                "different job, with another secret or communicator id?)");
        } else {
          // After our Challenge, a peer that cannot verify it (another secret) hangs up.
          if (pc.phase == 0) {
            drop(pc, "closed during the handshake", /*bare=*/true);
          } else {
            drop(pc, "closed after our challenge instead of proving the job secret (a rank "
                     "holding a different secret, or a stranger)");
          }
          return Status::ok();
        }
      }
      ++pc.phase;
      if (pc.outgoing) return pc.phase == 1 ? onChallenge(pc) : onAck(pc);
      return pc.phase == 1 ? onHello(pc) : onProof(pc);
    }
    return Status::ok();
  }

  // Connector: the acceptor must prove it holds the job key before we prove that we do.
  Status onChallenge(Pending& pc) {
    std::memcpy(&pc.challenge, pc.in, sizeof(Challenge));
    const Challenge& c = pc.challenge;
    const crypto::Mac expected = challengeMac(p_.identity, pc.hello, c);
    if (c.magic != kMagic || c.rank != pc.peer ||
        !crypto::equalConstantTime(expected.data(), c.mac, expected.size())) {
      return protocolError(
          outgoingWho(pc) + " did not prove that it holds this job's secret: the ranks hold "
          "different secrets (NANOCCL_SECRET_FILE / NANOCCL_SECRET), or another process answers "
          "at that address");
    }
    Proof proof{};
    proof.magic = kMagic;
    const crypto::Mac mac = proofMac(p_.identity, pc.hello, c);
    std::memcpy(proof.mac, mac.data(), mac.size());
    sendThenRead<HelloAck>(pc, proof);
    return step(pc);
  }

  Status onAck(Pending& pc) {
    HelloAck ack;
    std::memcpy(&ack, pc.in, sizeof(ack));
    const std::string who = outgoingWho(pc);
    if (ack.magic != kMagic) return protocolError(who + " answered the handshake with garbage");
    if (ack.verdict == HelloVerdict::kConfigMismatch) {
      return mismatchError(who + " refused the connection: settings differ (rank " +
                           std::to_string(pc.peer) + ": " + nsocksText(ack.nsocks) +
                           " stripe_min_bytes=" + std::to_string(ack.stripeMinBytes) + " " +
                           encryptionText(ack.flags) + "; rank " + std::to_string(p_.rank) +
                           ": " + nsocksText(p_.nsocks) +
                           " stripe_min_bytes=" + std::to_string(p_.stripeMinBytes) + " " +
                           encryptionText(pc.hello.flags) +
                           "); set the same NANOCCL_* values on every rank");
    }
    if (ack.verdict != HelloVerdict::kAccepted) {
      return protocolError(who + " refused the connection (verdict " +
                           std::to_string(static_cast<uint32_t>(ack.verdict)) + ")");
    }
    const SessionKeys keys = sessionKeys(p_.identity, pc.hello, pc.challenge);
    links_[pc.peer][pc.socketIndex] = {pc.fd, keys.connectorToAcceptor, keys.acceptorToConnector};
    pc.fd = -1;
    ++outgoingDone_;
    return Status::ok();
  }

  // Acceptor: anyone who speaks the protocol gets a Challenge; only a Proof admits them.
  Status onHello(Pending& pc) {
    std::memcpy(&pc.hello, pc.in, sizeof(Hello));
    const Hello& h = pc.hello;
    if (h.version != kHandshakeVersion) {
      drop(pc, "handshake version " + std::to_string(h.version) + ", expected " +
                   std::to_string(kHandshakeVersion) + " (a different nanoccl build)");
      return Status::ok();
    }
    if (h.commIdHash != p_.identity.commHash()) {
      drop(pc, "another communicator (comm id differs)");
      return Status::ok();
    }
    Challenge& c = pc.challenge;
    c.magic = kMagic;
    c.rank = p_.rank;
    NANOCCL_CHECK(crypto::randomBytes(c.nonce, sizeof(c.nonce)));
    const crypto::Mac mac = challengeMac(p_.identity, h, c);
    std::memcpy(c.mac, mac.data(), mac.size());
    sendThenRead<Proof>(pc, c);
    return step(pc);
  }

  Status onProof(Pending& pc) {
    Proof proof;
    std::memcpy(&proof, pc.in, sizeof(proof));
    const Hello& h = pc.hello;
    const crypto::Mac expected = proofMac(p_.identity, h, pc.challenge);
    if (!crypto::equalConstantTime(expected.data(), proof.mac, expected.size())) {
      drop(pc, "no proof of the job secret (a wrong secret, or a replayed handshake)");
      return Status::ok();
    }
    // From here on the peer belongs to the job: disagreements are fatal and explained.
    const uint32_t ourFlags = p_.encrypt ? kHelloEncrypt : 0;
    HelloAck ack{kMagic, HelloVerdict::kAccepted, p_.rank, p_.nsocks, p_.stripeMinBytes,
                 ourFlags, 0};
    Status fatal;
    if (h.size != p_.size || h.rank <= p_.rank || h.rank >= p_.size || h.nsocks != p_.nsocks ||
        h.stripeMinBytes != p_.stripeMinBytes || h.socketIndex >= p_.nsocks ||
        h.flags != ourFlags) {
      ack.verdict = HelloVerdict::kConfigMismatch;
      fatal = mismatchError(
          "rank " + std::to_string(p_.rank) + ": rank " + std::to_string(h.rank) +
          " connected with different settings (its size=" + std::to_string(h.size) +
          " " + nsocksText(h.nsocks) +
          " stripe_min_bytes=" + std::to_string(h.stripeMinBytes) + " " +
          encryptionText(h.flags) + "; ours size=" + std::to_string(p_.size) +
          " " + nsocksText(p_.nsocks) +
          " stripe_min_bytes=" + std::to_string(p_.stripeMinBytes) + " " +
          encryptionText(ourFlags) + "); set the same NANOCCL_* values on every rank");
    } else if (links_[h.rank][h.socketIndex].fd >= 0) {
      ack.verdict = HelloVerdict::kDuplicate;
    }
    setOut(pc, ack);
    pc.stage = Pending::Stage::kSending;
    if (!fatal.isOk()) {
      // Best effort: tell the peer why, then fail.
      [[maybe_unused]] ssize_t n = ::send(pc.fd, pc.out, pc.outLen, MSG_NOSIGNAL);
      return fatal;
    }
    if (ack.verdict == HelloVerdict::kDuplicate) {
      [[maybe_unused]] ssize_t n = ::send(pc.fd, pc.out, pc.outLen, MSG_NOSIGNAL);
      drop(pc, "duplicate connection from rank " + std::to_string(h.rank));
      return Status::ok();
    }
    pc.peer = h.rank;
    pc.socketIndex = h.socketIndex;
    return step(pc);
  }

  void finishIncoming(Pending& pc) {
    const SessionKeys keys = sessionKeys(p_.identity, pc.hello, pc.challenge);
    links_[pc.peer][pc.socketIndex] = {pc.fd, keys.acceptorToConnector, keys.connectorToAcceptor};
    pc.fd = -1;
    ++incomingDone_;
  }

  const std::vector<Listener>& listeners_;
  const std::vector<std::string>& addresses_;
  const MeshParams& p_;
  std::vector<std::vector<SocketAddress>> targets_;  // readTargets()
  std::vector<Pending> pending_;
  std::vector<std::tuple<int, int, Clock::time_point>> refused_;
  std::vector<std::vector<MeshLink>> links_;
  std::string rejection_;  // drop()'s: the last connection turned away, by cause first
  Status hungUp_;  // hangUp()'s: the first outgoing connection a peer closed, and when to say so
  int hungUpPeer_ = -1;
  Clock::time_point hungUpReportAt_{};
  bool rejectionNamesCause_ = false;
  int outgoingDone_ = 0;
  int incomingDone_ = 0;
  int expectedIncoming_ = 0;
  bool success_ = false;
};

}  // namespace

Result<Listener> openListener(const InterfaceAddress& iface) {
  Listener l;
  l.ifname = iface.name;
  l.address = iface.address;
  l.fd = socket(l.address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l.fd < 0) return systemError("socket", errno);
  const int one = 1;
  setsockopt(l.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(l.fd, reinterpret_cast<const sockaddr*>(&l.address.storage), l.address.length) != 0 ||
      listen(l.fd, 512) != 0) {
    const int err = errno;
    close(l.fd);
    return systemError(("bind/listen on " + l.address.toString()).c_str(), err);
  }
  l.address.length = sizeof(l.address.storage);
  getsockname(l.fd, reinterpret_cast<sockaddr*>(&l.address.storage), &l.address.length);
  return l;
}

Result<std::vector<Listener>> openListeners(const std::string& ifnameSpec) {
  NANOCCL_ASSIGN_OR_RETURN(const std::vector<InterfaceAddress> rails, pickRails(ifnameSpec));
  std::vector<Listener> out;
  for (const InterfaceAddress& iface : rails) {
    Result<Listener> l = openListener(iface);
    if (!l.isOk()) {
      for (const Listener& opened : out) close(opened.fd);
      return l.status();
    }
    out.push_back(std::move(l).value());
  }
  if (out.size() > 1) {
    std::string rails;
    for (const Listener& l : out) rails += " " + l.ifname + "=" + l.address.toString();
    NANOCCL_INFO("tcp: " << out.size() << " rails (NANOCCL_SOCKET_IFNAME='" << ifnameSpec
                         << "'):" << rails);
  }
  return out;
}

Result<std::vector<std::vector<MeshLink>>> buildMesh(const std::vector<Listener>& listeners,
                                                     const std::vector<std::string>& addresses,
                                                     const MeshParams& params,
                                                     const Deadline& deadline) {
  if (static_cast<int>(addresses.size()) != params.size) {
    return invalidArgument("buildMesh: " + std::to_string(addresses.size()) +
                           " addresses for " + std::to_string(params.size) + " ranks");
  }
  if (listeners.empty()) return invalidArgument("buildMesh: no listening socket");
  MeshBuilder builder(listeners, addresses, params);
  return builder.run(deadline);
}

}  // namespace nanoccl::tcp
