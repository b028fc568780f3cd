// The TCP transport (tcp_transport.h), all but its Mover half: construction and destruction,
// listen() and connect() (the mesh itself is built by handshake.cc), the counters, and the
// stall reports' socket side. The Mover's send and receive paths are in progress.cc; the class
// and its connections in tcp_transport_impl.h.
#include "transports/tcp/tcp_transport.h"

#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/logging.h"
#include "transports/identity.h"
#include "transports/tcp/address.h"
#include "transports/tcp/handshake.h"
#include "transports/tcp/layout.h"
#include "transports/tcp/tcp_transport_impl.h"

namespace nanoccl::tcp {

TcpTransport::~TcpTransport() {
  stopEngine();
  for (auto& row : peers_) {
    for (auto& c : row) {
      if (c->fd >= 0) close(c->fd);
    }
  }
  for (const Listener& l : listeners_) {
    if (l.fd >= 0) close(l.fd);
  }
}

Result<std::string> TcpTransport::publish() {
  for (const Listener& l : listeners_) close(l.fd);  // a listen() refused below, called again
  listeners_.clear();
  NANOCCL_ASSIGN_OR_RETURN(listeners_, openListeners(o_.config.socketIfname));
  // Set on the listeners, the connections they accept inherit it; refused here, before any
  // peer waits on this rank, where the kernel does not allow it.
  for (const Listener& l : listeners_) {
    NANOCCL_ASSIGN_OR_RETURN(congestion_, chooseCongestionControl(l.fd, o_.config.tcpCongestion));
  }
  const std::vector<int64_t>& rates = o_.config.railMbps;
  if (!rates.empty() && rates.size() != listeners_.size()) {
    return invalidArgument("NANOCCL_RAIL_MBPS gives " + std::to_string(rates.size()) +
                           " rate(s) for " + std::to_string(listeners_.size()) +
                           " rail(s) (NANOCCL_SOCKET_IFNAME='" + o_.config.socketIfname +
                           "'): give one a rail, in the same order");
  }
  std::vector<RailAddress> rails;
  for (size_t k = 0; k < listeners_.size(); ++k) {
    rails.push_back({listeners_[k].address,
                     rates.empty() ? interfaceMbps(listeners_[k].ifname) : rates[k]});
  }
  if (o_.config.nsocks * static_cast<int>(rails.size()) > kMaxSocketsPerPeer) {
    return invalidArgument("NANOCCL_NSOCKS=" + std::to_string(o_.config.nsocks) + " on " +
                           std::to_string(rails.size()) + " rail(s) is more than " +
                           std::to_string(kMaxSocketsPerPeer) + " connections a peer");
  }
  // The settings every rank must share: each compares them with everyone's before it connects
  // (buildMesh).
  return formatRails(rails, "nsocks=" + std::to_string(o_.config.nsocks) +
                                " stripe_min_bytes=" + std::to_string(o_.config.stripeMinBytes) +
                                " encrypt=" + (o_.config.encrypt ? "1" : "0"));
}

Status TcpTransport::attach(const std::vector<std::string>& addresses,
                            const Deadline& deadline) {
  if (listeners_.front().fd < 0) {  // a connect() that failed after the mesh was built
    return invalidArgument(engine_.me() + "connect() again after its mesh was built and the "
                           "setup failed: make a new transport");
  }
  NANOCCL_ASSIGN_OR_RETURN(io_, createEngine(o_.config.tcpEngine));
  rails_ = static_cast<int>(listeners_.size());
  railSent_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(rails_));
  railReceived_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(rails_));
  NANOCCL_ASSIGN_OR_RETURN(railLayout_,
                           weighRails(addresses, rails_, o_.config.stripeMinBytes));
  MeshParams mp{CommIdentity(o_.secret, o_.commId)};
  mp.rank = o_.rank;
  mp.size = o_.size;
  mp.nsocks = connections();
  mp.tcpCongestion = congestion_;
  NANOCCL_ASSIGN_OR_RETURN(auto links, buildMesh(listeners_, addresses, mp, deadline));
  // Setup is over: strangers now meet a closed port.
  for (Listener& l : listeners_) {
    close(l.fd);
    l.fd = -1;
  }
  for (int p = 0; p < o_.size; ++p) {  // the destructor closes them from here on
    for (int s = 0; s < static_cast<int>(links[p].size()); ++s) {
      peers_[p].push_back(std::make_unique<Conn>());
      Conn& c = *peers_[p].back();
      c.fd = links[p][s].fd;
      c.peer = p;
      c.index = s;
    }
  }
  for (auto& row : peers_) {
    for (auto& c : row) {
      const MeshLink& link = links[c->peer][c->index];
      const IoEngine::Keys keys{link.txKey, link.rxKey};
      NANOCCL_CHECK(io_->addSocket(c->fd, o_.config.encrypt ? &keys : nullptr));
    }
  }
  return Status::ok();
}

// The progress thread's first turn: every connection awaits a header.
Status TcpTransport::started(const Deadline&) {
  engine_.run([this] {
    for (auto& row : peers_) {
      for (auto& c : row) postHeaderRecv(*c);
    }
  });
  return Status::ok();
}

bool TcpTransport::unstick() {
  for (auto& row : peers_) {
    for (auto& c : row) shutdown(c->fd, SHUT_RDWR);
  }
  return true;
}

std::vector<RailCounters> TcpTransport::railCounters() const {
  std::vector<RailCounters> out;
  if (!railSent_) return out;  // not connected
  for (int k = 0; k < rails_ && k < static_cast<int>(listeners_.size()); ++k) {
    out.push_back({listeners_[k].ifname, railSent_[k].load(std::memory_order_relaxed),
                   railReceived_[k].load(std::memory_order_relaxed)});
  }
  return out;
}

std::string TcpTransport::sendStalls(int peer) const {
  std::string out;
  for (const auto& c : peers_[static_cast<size_t>(peer)]) {
    tcp_info ti{};
    socklen_t len = sizeof(ti);
    int queued = 0;  // sent and not acknowledged, or not sent yet
    if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        ioctl(c->fd, SIOCOUTQ, &queued) != 0) {
      continue;
    }
    const std::string ifname = railName(*c);
    const bool unacked = ti.tcpi_unacked > 0 && ti.tcpi_last_ack_recv >= kStallReportMs;
    const bool unsent = queued > 0 && ti.tcpi_unacked == 0 &&
                        ti.tcpi_last_data_sent >= kStallReportMs;
    const bool down = interfaceDown(c->fd, ifname);
    if (!unacked && !unsent && !down) continue;
    char line[224];
    int n = std::snprintf(line, sizeof(line), "%s%s:", out.empty() ? "" : "; ",
                          connectionLabel(*c).c_str());
    if (unacked) {
      n += std::snprintf(line + n, sizeof(line) - n, " %.2f MB not acknowledged for %.1f s "
                         "(%u retransmissions)", queued / 1e6, ti.tcpi_last_ack_recv / 1e3,
                         ti.tcpi_total_retrans);
    } else if (unsent) {
      n += std::snprintf(line + n, sizeof(line) - n, " %.2f MB not sent for %.1f s",
                         queued / 1e6, ti.tcpi_last_data_sent / 1e3);
    }
    if (down) {
      std::snprintf(line + n, sizeof(line) - n, "%s%s is down here",
                    unacked || unsent ? ", " : " ", ifname.c_str());
    }
    out += line;
  }
  return out;
}

std::optional<Mover::LaneView> TcpTransport::laneView(int peer, int lane) const {
  const Conn& c = *peers_[static_cast<size_t>(peer)][static_cast<size_t>(lane)];
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (getsockopt(c.fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return std::nullopt;
  char note[64];
  std::snprintf(note, sizeof(note), "nothing received on it for %.1f s",
                ti.tcpi_last_data_recv / 1e3);
  return LaneView{connectionLabel(c), note};
}

std::string TcpTransport::railName(const Conn& c) const {
  const size_t rail = static_cast<size_t>(c.index % rails_);
  return rail < listeners_.size() ? listeners_[rail].ifname : "";
}

std::string TcpTransport::connectionLabel(const Conn& c) const {
  return "connection " + std::to_string(c.index) + " to rank " + std::to_string(c.peer) +
         (rails_ > 1 ? " on " + railName(c) : "");
}

bool TcpTransport::interfaceDown(int fd, const std::string& ifname) {
  ifreq ifr{};
  if (ifname.empty() || ifname.size() >= sizeof(ifr.ifr_name)) return false;
  std::memcpy(ifr.ifr_name, ifname.c_str(), ifname.size());
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) != 0) return false;
  return (ifr.ifr_flags & IFF_UP) == 0 || (ifr.ifr_flags & IFF_RUNNING) == 0;
}

std::string TcpTransport::describe() const {
  if (!io_) return "tcp";  // a world of one
  std::string via;
  for (const Listener& l : listeners_) {
    via += via.empty() ? " via " : ",";
    via += l.ifname;
  }
  return std::string("tcp/") + io_->name() + " x" +
         std::to_string(o_.config.nsocks) +
         (rails_ > 1 ? " on each of " + std::to_string(rails_) + " rails" : "") +
         (o_.config.encrypt ? " encrypted" : "") + via;
}

MatcherOptions TcpTransport::matcherOptions() {
  MatcherOptions mo;
  mo.lanes = connections();
  mo.parts = [this](OpType op, uint64_t seq, uint32_t tag, uint64_t total, int lanes) {
    return layout(seq, tag, op, total, lanes);
  };
  return mo;
}


Result<std::unique_ptr<Transport>> createTcpTransport(const TransportOptions& options) {
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(options));
}

}  // namespace nanoccl::tcp
