#include "transports/tcp/handshake.h"

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
#include <utility>

#include "common/logging.h"
#include "transports/tcp/wire.h"

namespace nanoccl::tcp {
namespace {

// Most half-open connections we keep while waiting for Hellos; more are closed at once, so a
// flood of strangers cannot exhaust descriptors.
constexpr std::ptrdiff_t kMaxPendingIncoming = 256;

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

// The handshake's records (wire.h), in the order they cross: the connector (outgoing) sends the
// even ones, Hello and Proof; the acceptor (incoming) the odd ones, Challenge and HelloAck.
constexpr int kRecords = 4;
constexpr size_t kHandshakeRecordBytes[kRecords] = {sizeof(Hello), sizeof(Challenge),
                                                    sizeof(Proof), sizeof(HelloAck)};

// One connection being set up: its records in turn, each sent or read through `buf`.
struct Pending {
  int fd;
  bool outgoing;
  int peer = -1;         // outgoing: target rank; incoming: known after the Proof
  int socketIndex = -1;  // outgoing: which connection; incoming: known after the Proof
  int record = 0;        // the record on the wire now (kHandshakeRecordBytes); kRecords: done
  size_t done = 0;       // its bytes sent or read so far
  Clock::time_point retryAt{};  // outgoing, its connect failed: dialled again then
  char buf[std::ranges::max(kHandshakeRecordBytes)] = {};
  Hello hello{};          // as the connector sent it
  Challenge challenge{};  // as the acceptor sent it

  // Whether this side sends the record on the wire now (or reads it).
  bool sending() const { return outgoing == (record % 2 == 0); }
  bool retrying() const { return retryAt != Clock::time_point{}; }
};

class MeshBuilder {
 public:
  MeshBuilder(const std::vector<Listener>& listeners, const std::vector<std::string>& addresses,
              const MeshParams& p)
      : listeners_(listeners),
        addresses_(addresses),
        p_(p),
        me_("rank " + std::to_string(p.rank) + ": "),
        links_(static_cast<size_t>(p.size)) {
    for (int r = 0; r < p.size; ++r) {
      if (r != p.rank) links_[r].resize(static_cast<size_t>(p.nsocks));
    }
  }

  // Closes what was not handed over (run() empties links_ when it does).
  ~MeshBuilder() {
    for (const Pending& pc : pending_) {
      if (pc.fd >= 0) close(pc.fd);
    }
    for (const auto& row : links_) {
      for (const MeshLink& l : row) {
        if (l.fd >= 0) close(l.fd);
      }
    }
  }

  Result<std::vector<std::vector<MeshLink>>> run(const Deadline& deadline) {
    NANOCCL_CHECK(readTargets());
    for (int peer = 0; peer < p_.rank; ++peer) {
      for (int s = 0; s < p_.nsocks; ++s) {
        NANOCCL_CHECK(dial(pending_.emplace_back(Pending{-1, /*outgoing=*/true, peer, s})));
      }
    }
    const size_t nListeners = listeners_.size();
    while (linked_ < (p_.size - 1) * p_.nsocks) {
      if (deadline.expired()) return timeoutError(describeMissing());
      std::vector<pollfd> pfds;
      for (const Listener& l : listeners_) pfds.push_back({l.fd, POLLIN, 0});
      for (const Pending& pc : pending_) {
        pfds.push_back({pc.fd, static_cast<short>(pc.sending() ? POLLOUT : POLLIN), 0});
      }
      const int n = ::poll(pfds.data(), pfds.size(), deadline.remainingMs(50));
      if (n < 0 && errno != EINTR) return systemError("poll", errno);
      for (size_t i = 0; i < nListeners; ++i) {
        if (pfds[i].revents & POLLIN) NANOCCL_CHECK(acceptAll(listeners_[i].fd));
      }
      for (size_t i = nListeners; i < pfds.size(); ++i) {
        Pending& pc = pending_[i - nListeners];  // (poll passes over a closed one, fd -1)
        if (pfds[i].revents != 0) {
          NANOCCL_CHECK(step(pc));
        } else if (pc.retrying() && Clock::now() >= pc.retryAt) {
          NANOCCL_CHECK(dial(pc));
        }
      }
      // Forget finished and dropped connections; a refused one waits for its retry.
      std::erase_if(pending_, [](const Pending& pc) { return pc.fd < 0 && !pc.retrying(); });
    }
    return std::exchange(links_, {});
  }

 private:
  int rails() const { return static_cast<int>(listeners_.size()); }

  // Every rank's rails (targets_[rank]), and the same settings and rail count everywhere: each
  // rank reads the same addresses, so a rank with other settings or fewer interfaces fails
  // every rank alike, before any connection.
  Status readTargets() {
    const std::string ours = publishedSettings(addresses_[p_.rank]);
    targets_.resize(static_cast<size_t>(p_.size));
    for (int r = 0; r < p_.size; ++r) {
      if (r == p_.rank) continue;
      const std::string them = "rank " + std::to_string(r);
      Result<std::vector<RailAddress>> published = parseRails(addresses_[r]);
      if (!published.isOk()) {
        return published.status().withContext(me_ + them + "'s published address: ");
      }
      if (const std::string theirs = publishedSettings(addresses_[r]); theirs != ours) {
        return mismatchError(me_ + them + " runs " +
                             (theirs.empty() ? "with no settings published (an older build?)"
                                             : theirs) +
                             ", this rank " + ours +
                             "; set the same NANOCCL_* values on every rank");
      }
      for (const RailAddress& rail : *published) targets_[r].push_back(rail.address);
      if (static_cast<int>(targets_[r].size()) != rails()) {
        return mismatchError(
            me_ + them + " listens on " + std::to_string(targets_[r].size()) + " rail(s) (" +
            formatRails(*published) + "), this rank on " + std::to_string(rails()) + " (" +
            describeRails() + "); NANOCCL_SOCKET_IFNAME (and NANOCCL_RAIL_PER_LOCAL_RANK) must "
            "select as many interfaces on every rank, rail k of each on the same network");
      }
      for (int k = 0; k < rails(); ++k) {
        if (targets_[r][k].family() != listeners_[k].address.family()) {
          return mismatchError(me_ + "rail " + std::to_string(k) + " is " +
                               listeners_[k].address.toString() + " via " + listeners_[k].ifname +
                               " here but " + targets_[r][k].toString() + " on " + them +
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
      out += (out.empty() ? "" : ", ") + l.address.toString() + " via " + l.ifname;
    }
    return out;
  }

  std::string describeMissing() const {
    std::string missing;
    std::vector<bool> railMissing(static_cast<size_t>(rails()), false);
    for (int r = 0; r < p_.size; ++r) {
      bool listed = false;
      for (size_t s = 0; s < links_[r].size(); ++s) {  // none for this rank
        if (links_[r][s].fd >= 0) continue;
        railMissing[s % railMissing.size()] = true;
        if (!listed) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        listed = true;
      }
    }
    // With several rails, which ones lack connections: a rail down, or not one network.
    std::string onRails;
    for (int k = 0; rails() > 1 && k < rails(); ++k) {
      if (!railMissing[k]) continue;
      onRails += (onRails.empty() ? " on rail(s) " : ", ") + listeners_[k].ifname;
    }
    // Our own connects: the last one that failed, and those never answered (a firewall, or no
    // route: the peer's SYN-ACK never came).
    std::string connects;
    if (!connectFailure_.empty()) connects += "; the last connect failed: " + connectFailure_;
    int unanswered = 0;
    for (const Pending& pc : pending_) {
      if (!pc.outgoing || pc.fd < 0 || pc.record != 0 || pc.done != 0) continue;
      if (unanswered++ == 0) connects += "; no answer to the connect to " + target(pc);
    }
    if (unanswered > 1) connects += " (and " + std::to_string(unanswered - 1) + " more)";
    return me_ + "connection setup timed out waiting for rank(s) " + missing + onRails +
           " (listening on " + describeRails() +
           "; check NANOCCL_SOCKET_IFNAME and that every rank started" + connects +
           (rejection_.empty() ? "" : "; last connection turned away: " + rejection_) + ")";
  }

  // Opens outgoing `pc`'s connection (again, after its connect failed) with its Hello, a fresh
  // nonce, in pc.buf: the connect completes in the poll loop, and the Hello goes out then.
  Status dial(Pending& pc) {
    const int rail = pc.socketIndex % rails();
    const SocketAddress& target = targets_[pc.peer][rail];
    pc.retryAt = {};
    // Pending from here on: should the rest fail, ~MeshBuilder closes it with everything else.
    pc.fd = socket(target.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (pc.fd < 0) return systemError("socket", errno);
    NANOCCL_CHECK(tuneSocket(pc.fd, p_.tcpCongestion));
    if (rails() > 1) {
      // Leave from the rail's own address (its port picked at connect time), so that a host
      // routing by source address sends it out of that interface.
      const int one = 1;
      setsockopt(pc.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
      SocketAddress local = listeners_[rail].address;
      local.setPort(0);
      if (bind(pc.fd, reinterpret_cast<const sockaddr*>(&local.storage), local.length) != 0) {
        const int err = errno;
        return systemError(("bind to " + local.toString() + " (rail " + std::to_string(rail) +
                            ", " + listeners_[rail].ifname + ")").c_str(), err);
      }
    }
    pc.hello = {.magic = kMagic,
                .version = kHandshakeVersion,
                .socketIndex = static_cast<uint16_t>(pc.socketIndex),
                .rank = p_.rank,
                .size = p_.size,
                .commIdHash = p_.identity.commHash(),
                .nonce = {}};
    NANOCCL_CHECK(crypto::randomBytes(pc.hello.nonce, sizeof(pc.hello.nonce)));
    std::memcpy(pc.buf, &pc.hello, sizeof(Hello));
    if (::connect(pc.fd, reinterpret_cast<const sockaddr*>(&target.storage), target.length) != 0 &&
        errno != EINPROGRESS) {
      const int err = errno;
      return systemError(
          ("connect to rank " + std::to_string(pc.peer) + " at " + target.toString()).c_str(),
          err);
    }
    return Status::ok();
  }

  Status acceptAll(int listenFd) {
    while (true) {
      const int fd = accept4(listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED ||
            errno == EMFILE || errno == ENFILE) {
          return Status::ok();
        }
        return systemError("accept4", errno);
      }
      if (std::count_if(pending_.begin(), pending_.end(),
                        [](const Pending& pc) { return !pc.outgoing; }) >= kMaxPendingIncoming) {
        NANOCCL_WARN(me_ << "too many unauthenticated connections; closing one");
        close(fd);
        continue;
      }
      // Accepted sockets inherit the listener's congestion control (set in listen()); setting it
      // again cannot fail where that succeeded.
      (void)tuneSocket(fd, p_.tcpCongestion);
      pending_.push_back(Pending{fd, /*outgoing=*/false});
    }
  }

  // Closes a connection that did not get in. `why` names a cause (a wrong secret, another
  // communicator) unless `bare` (a peer that hung up): the timeout's message keeps the latest
  // cause, which a bare close never overwrites; a rank with another secret hangs up its other
  // connections too, and those may reach us first or last.
  Status drop(Pending& pc, const std::string& why, bool bare = false) {
    const std::string rejection = peerName(pc.fd) + ": " + why;
    if (!bare || !rejectionNamesCause_) {
      rejection_ = rejection;
      rejectionNamesCause_ = !bare;
    }
    NANOCCL_WARN(me_ << "rejected a connection from " << rejection);
    close(pc.fd);
    pc.fd = -1;
    return Status::ok();
  }

  // The other side closed `pc` (or its socket failed) before the handshake was through.
  Status closedEarly(Pending& pc) {
    if (!pc.outgoing) {
      if (pc.sending()) return drop(pc, "closed before our answer was sent", /*bare=*/true);
      if (pc.record == 0) return drop(pc, "closed during the handshake", /*bare=*/true);
      // After our Challenge, a peer that cannot verify it (another secret) hangs up.
      return drop(pc,
                  "closed after our challenge instead of proving the job secret (a rank "
                  "holding a different secret, or a stranger)");
    }
    // One of our connections: the peer turned it away, or failed; so does the setup.
    return peerError(outgoingWho(pc) +
                     (pc.sending() ? " closed the connection during setup"
                                   : " closed the connection during the handshake (is it running "
                                     "a different job, with another secret or communicator id?)"));
  }

  std::string target(const Pending& pc) const {  // "rank <peer> at <address>"
    return "rank " + std::to_string(pc.peer) + " at " +
           targets_[pc.peer][pc.socketIndex % rails()].toString();
  }
  std::string outgoingWho(const Pending& pc) const { return me_ + target(pc); }

  // Moves `pc` on as far as its socket allows without blocking.
  Status step(Pending& pc) {
    while (pc.fd >= 0 && pc.record < kRecords) {
      const bool sending = pc.sending();
      const size_t size = kHandshakeRecordBytes[pc.record];
      const ssize_t n = sending ? ::send(pc.fd, pc.buf + pc.done, size - pc.done, MSG_NOSIGNAL)
                                : ::recv(pc.fd, pc.buf + pc.done, size - pc.done, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Status::ok();
      if (n < 0 && pc.outgoing && pc.record == 0 && pc.done == 0) {
        // The connect failed (the first send says how). The peer listens before it publishes
        // its address, so a refusal is transient (a restarted job, a slow interface): dial
        // again until the deadline, as NCCL does.
        connectFailure_ = target(pc) + ": " + std::strerror(errno);
        close(pc.fd);
        pc.fd = -1;
        pc.retryAt = Clock::now() + std::chrono::milliseconds(20);
        return Status::ok();
      }
      if (n <= 0) return closedEarly(pc);
      pc.done += static_cast<size_t>(n);
      // Reject garbage as soon as the magic is in, without waiting for the rest.
      if (!pc.outgoing && !sending && pc.done >= sizeof(kMagic) &&
          std::memcmp(pc.buf, &kMagic, sizeof(kMagic)) != 0) {
        return drop(pc, "not a nanoccl handshake (bad magic)");
      }
      if (pc.done < size) continue;
      pc.done = 0;
      const int finished = pc.record++;
      if (!sending) NANOCCL_CHECK(onRead(pc, finished));
      if (pc.record == kRecords) admit(pc);
    }
    return Status::ok();
  }

  // Checks the record just read (0 Hello, 1 Challenge, 2 Proof, 3 HelloAck) and, unless it was
  // the last, puts this side's answer in pc.buf; or drops the connection.
  Status onRead(Pending& pc, int record) {
    if (pc.outgoing) return record == 1 ? onChallenge(pc) : onAck(pc);
    return record == 0 ? onHello(pc) : onProof(pc);
  }

  // Acceptor: anyone who speaks the protocol gets a Challenge; only a Proof admits them.
  Status onHello(Pending& pc) {
    std::memcpy(&pc.hello, pc.buf, sizeof(Hello));
    const Hello& h = pc.hello;
    if (h.version != kHandshakeVersion) {
      return drop(pc, "handshake version " + std::to_string(h.version) + ", expected " +
                          std::to_string(kHandshakeVersion) + " (a different nanoccl build)");
    }
    if (h.commIdHash != p_.identity.commHash()) {
      return drop(pc, "another communicator (comm id differs)");
    }
    // Not proven yet: a connection this rank does not expect is turned away, never fatal.
    if (h.size != p_.size || h.rank <= p_.rank || h.rank >= p_.size || h.socketIndex >= p_.nsocks) {
      return drop(pc, "claims rank " + std::to_string(h.rank) + " of " + std::to_string(h.size) +
                          ", connection " + std::to_string(h.socketIndex) +
                          ", which this rank does not accept");
    }
    Challenge& c = pc.challenge;
    c.magic = kMagic;
    c.rank = p_.rank;
    NANOCCL_CHECK(crypto::randomBytes(c.nonce, sizeof(c.nonce)));
    const crypto::Mac mac = challengeMac(p_.identity, h, c);
    std::memcpy(c.mac, mac.data(), mac.size());
    std::memcpy(pc.buf, &c, sizeof(c));
    return Status::ok();
  }

  // Connector: the acceptor must prove it holds the job key before we prove that we do.
  Status onChallenge(Pending& pc) {
    std::memcpy(&pc.challenge, pc.buf, sizeof(Challenge));
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
    std::memcpy(pc.buf, &proof, sizeof(proof));
    return Status::ok();
  }

  Status onProof(Pending& pc) {
    Proof proof;
    std::memcpy(&proof, pc.buf, sizeof(proof));
    const Hello& h = pc.hello;
    const crypto::Mac expected = proofMac(p_.identity, h, pc.challenge);
    if (!crypto::equalConstantTime(expected.data(), proof.mac, expected.size())) {
      return drop(pc, "no proof of the job secret (a wrong secret, or a replayed handshake)");
    }
    const auto taken = [&](const Pending& o) {  // admitted, or proven and sending its ack
      return &o != &pc && !o.outgoing && o.fd >= 0 && o.peer == h.rank &&
             o.socketIndex == h.socketIndex;
    };
    if (links_[h.rank][h.socketIndex].fd >= 0 ||
        std::any_of(pending_.begin(), pending_.end(), taken)) {
      // Best effort: tell the peer why, then close.
      const HelloAck duplicate{kMagic, HelloVerdict::kDuplicate};
      [[maybe_unused]] ssize_t n = ::send(pc.fd, &duplicate, sizeof(duplicate), MSG_NOSIGNAL);
      return drop(pc, "duplicate connection from rank " + std::to_string(h.rank));
    }
    const HelloAck ack{kMagic, HelloVerdict::kAccepted};
    pc.peer = h.rank;
    pc.socketIndex = h.socketIndex;
    std::memcpy(pc.buf, &ack, sizeof(ack));
    return Status::ok();
  }

  Status onAck(Pending& pc) {
    HelloAck ack;
    std::memcpy(&ack, pc.buf, sizeof(ack));
    const std::string who = outgoingWho(pc);
    if (ack.magic != kMagic) return protocolError(who + " answered the handshake with garbage");
    if (ack.verdict != HelloVerdict::kAccepted) {
      return protocolError(who + " refused the connection (verdict " +
                           std::to_string(static_cast<uint32_t>(ack.verdict)) + ")");
    }
    return Status::ok();
  }

  // The handshake is through: `pc` joins the mesh with the keys of this side.
  void admit(Pending& pc) {
    const SessionKeys keys = sessionKeys(p_.identity, pc.hello, pc.challenge);
    links_[pc.peer][pc.socketIndex] =
        pc.outgoing ? MeshLink{pc.fd, keys.connectorToAcceptor, keys.acceptorToConnector}
                    : MeshLink{pc.fd, keys.acceptorToConnector, keys.connectorToAcceptor};
    pc.fd = -1;
    ++linked_;
  }

  const std::vector<Listener>& listeners_;
  const std::vector<std::string>& addresses_;
  const MeshParams& p_;
  const std::string me_;  // "rank R: ", how this rank's messages begin
  // [peer][socketIndex]: fd -1 until admitted; linked_ of them are.
  std::vector<std::vector<MeshLink>> links_;
  int linked_ = 0;
  std::vector<std::vector<SocketAddress>> targets_;  // readTargets()
  std::vector<Pending> pending_;
  std::string rejection_;  // drop()'s: the last connection turned away, by cause first
  std::string connectFailure_;  // step()'s: the last of our connects that failed, and why
  bool rejectionNamesCause_ = false;
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
