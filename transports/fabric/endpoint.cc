// Opening and driving the libfabric objects of one fabric transport (endpoint.h), and rxm's
// settings that fix the frame size.
#include "transports/fabric/endpoint.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/logging.h"
#include "transports/fabric/libfabric.h"
#include "transports/netif.h"

namespace nanoccl::fabric {
namespace {

// Frames fit ofi_rxm's eager size (FI_OFI_RXM_BUFFER_SIZE), so each goes out at once; larger
// ones take rxm's rendezvous, which halved the bandwidth of a 1 Gbit/s link here (measured:
// 0.060 against 0.117 GB/s for 256 KiB frames). rxm's default, 16 KiB, costs a completion, a
// header and a matcher call per 16 KiB: at 64 KiB the loopback stream went from 1.6 to
// 2.5-3.1 GB/s, and the 2x2 int8 allreduce at 1 Gbit/s from 4.7-4.9x to 5.4x Gloo. So unless
// the user set them, the first fabric transport of a process sets rxm's buffer to 64 KiB and
// its receive buffers per connection to 32 (rxm's 128 of 64 KiB each took ~200 MB more per
// rank), before libfabric reads them (providerDefaults()). A frame's payload is the buffer
// less kFrameSlack (our header, and rxm's).
constexpr uint64_t kDefaultRxmBuffer = 64 * 1024;
constexpr uint64_t kFrameSlack = 128;

}  // namespace

uint64_t providerDefaults() {
  static const uint64_t chunk = [] {
    setenv("FI_OFI_RXM_BUFFER_SIZE", std::to_string(kDefaultRxmBuffer).c_str(), 0);
    setenv("FI_OFI_RXM_MSG_RX_SIZE", "32", 0);
    const char* v = std::getenv("FI_OFI_RXM_BUFFER_SIZE");
    char* end = nullptr;
    const unsigned long long n = v != nullptr ? std::strtoull(v, &end, 10) : 0;
    const bool valid = end != nullptr && end != v && *end == '\0';
    if (!valid) {
      NANOCCL_WARN("fabric: FI_OFI_RXM_BUFFER_SIZE='" << (v != nullptr ? v : "")
                   << "' is not a number; frames of " << kDefaultRxmBuffer - kFrameSlack
                   << " bytes (slower if rxm's eager size is smaller)");
    }
    const uint64_t buffer = std::clamp<uint64_t>(valid ? n : kDefaultRxmBuffer, 4096, 4 << 20);
    return buffer - kFrameSlack;
  }();
  return chunk;
}

std::string fiError(const char* what, ssize_t rc) {
  return std::string(what) + ": " + libfabric().strerror(static_cast<int>(-rc));
}

Status Endpoint::open(const TransportOptions& o, size_t cqSize) {
  const std::string where = "rank " + std::to_string(o.rank) + ": fabric: ";
  Result<const Libfabric*> loaded = loadLibfabric();
  if (!loaded.isOk()) return loaded.status().withContext("rank " + std::to_string(o.rank) + ": ");
  const Libfabric& fi = **loaded;
  fi_info* hints = fi.dupinfo(nullptr);
  if (hints == nullptr) return internalError(where + "fi_dupinfo failed");
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->mr_mode = 0;  // payloads go straight from callers' buffers
  const char* env = std::getenv("FI_PROVIDER");
  const std::string wanted = env != nullptr && *env != '\0' ? env : "tcp;ofi_rxm";
  if (env == nullptr || *env == '\0') hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
  fi_info* list = nullptr;
  const int rc = fi.getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, &list);
  fi.freeinfo(hints);
  if (rc != 0 || list == nullptr) {
    return unavailableError(where + "libfabric " + std::to_string(FI_MAJOR(fi.version())) +
                            "." + std::to_string(FI_MINOR(fi.version())) +
                            " has no provider '" + wanted +
                            "' for reliable tagged messages without memory registration (" +
                            (env != nullptr ? "FI_PROVIDER=" + wanted : "FI_PROVIDER unset") +
                            "): " + fi.strerror(-rc));
  }
  // A TCP-based provider has a domain per network interface: take the one
  // NANOCCL_SOCKET_IFNAME picks, as the tcp transport would (its first rail: this transport
  // does not stripe over several).
  fi_info* chosen = list;
  const std::string prov = list->fabric_attr->prov_name;
  if (prov.find("tcp") != std::string::npos || prov.find("sockets") != std::string::npos) {
    Result<std::vector<InterfaceAddress>> rails = pickRails(o.config.socketIfname);
    if (!rails.isOk()) {
      fi.freeinfo(list);
      return rails.status().withContext(where);
    }
    const InterfaceAddress& itf = rails->front();
    chosen = nullptr;
    for (fi_info* i = list; i != nullptr && chosen == nullptr; i = i->next) {
      if (i->domain_attr->name != nullptr && itf.name == i->domain_attr->name &&
          i->addr_format == FI_SOCKADDR_IN) {
        chosen = i;
      }
    }
    for (fi_info* i = list; i != nullptr && chosen == nullptr; i = i->next) {
      if (i->domain_attr->name != nullptr && itf.name == i->domain_attr->name) chosen = i;
    }
    if (chosen == nullptr) {
      fi.freeinfo(list);
      return unavailableError(where + "provider " + prov + " offers no domain on interface " +
                              itf.name + " (NANOCCL_SOCKET_IFNAME)");
    }
  }
  info_.reset(fi.dupinfo(chosen));
  fi.freeinfo(list);
  provider_ = info_->fabric_attr->prov_name;
  domainName_ = info_->domain_attr->name != nullptr ? info_->domain_attr->name : "";
  iovLimit_ = info_->tx_attr->iov_limit;
  static std::once_flag logged;
  std::call_once(logged, [&] {
    NANOCCL_INFO("fabric: libfabric " << FI_MAJOR(fi.version()) << "." << FI_MINOR(fi.version())
                 << ", provider " << provider_ << " "
                 << FI_MAJOR(info_->fabric_attr->prov_version)
                 << "." << FI_MINOR(info_->fabric_attr->prov_version) << ", fabric "
                 << (info_->fabric_attr->name ? info_->fabric_attr->name : "?") << ", domain "
                 << domainName_);
  });

  const auto check = [&](const char* what, int rc) {
    return rc == 0 ? Status::ok() : unavailableError(where + fiError(what, rc));
  };
  // Each object is kept (closed by close()) as soon as it is open.
  fid_fabric* fabric = nullptr;
  NANOCCL_CHECK(check("fi_fabric", fi.fabric(info_->fabric_attr, &fabric, nullptr)));
  fabric_.reset(&fabric->fid);
  fid_domain* domain = nullptr;
  NANOCCL_CHECK(check("fi_domain", fi_domain(fabric, info_.get(), &domain, nullptr)));
  domain_.reset(&domain->fid);
  fi_cq_attr cqAttr{};
  cqAttr.format = FI_CQ_FORMAT_TAGGED;
  cqAttr.wait_obj = FI_WAIT_UNSPEC;
  cqAttr.size = cqSize;
  fid_cq* cq = nullptr;
  if (fi_cq_open(domain, &cqAttr, &cq, nullptr) != 0) {
    cqAttr.wait_obj = FI_WAIT_NONE;  // the provider cannot block: the loop sleeps instead
    canWait_ = false;
    NANOCCL_CHECK(check("fi_cq_open", fi_cq_open(domain, &cqAttr, &cq, nullptr)));
  }
  cq_.reset(&cq->fid);
  fi_av_attr avAttr{};
  avAttr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  NANOCCL_CHECK(check("fi_av_open", fi_av_open(domain, &avAttr, &av, nullptr)));
  av_.reset(&av->fid);
  fid_ep* ep = nullptr;
  NANOCCL_CHECK(check("fi_endpoint", fi_endpoint(domain, info_.get(), &ep, nullptr)));
  ep_.reset(&ep->fid);
  NANOCCL_CHECK(check("fi_ep_bind(cq)", fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)));
  NANOCCL_CHECK(check("fi_ep_bind(av)", fi_ep_bind(ep, &av->fid, 0)));
  return check("fi_enable", fi_enable(ep));
}

void Endpoint::InfoDeleter::operator()(fi_info* i) const { libfabric().freeinfo(i); }

void Endpoint::close() {
  ep_.reset();
  av_.reset();
  cq_.reset();
  domain_.reset();
  fabric_.reset();
}

ssize_t Endpoint::postRecv(void* buf, size_t bytes, fi_context* ctx) {
  return fi_trecv(ep(), buf, bytes, nullptr, FI_ADDR_UNSPEC, kTag, 0, ctx);
}

ssize_t Endpoint::send(fi_addr_t addr, WireHeader* h, const char* payload, size_t length,
                       std::string* scratch, fi_context* ctx) {
  iovec iov[2] = {{h, sizeof(*h)}, {const_cast<char*>(payload), length}};
  size_t count = length > 0 ? 2 : 1;
  if (count == 2 && iovLimit_ < 2) {  // one buffer: header and payload copied together
    std::string whole(reinterpret_cast<const char*>(h), sizeof(*h));
    whole.append(payload, length);
    *scratch = std::move(whole);
    iov[0] = {scratch->data(), scratch->size()};
    count = 1;
  }
  fi_msg_tagged msg{};
  msg.msg_iov = iov;
  msg.iov_count = count;
  msg.addr = addr;
  msg.tag = kTag;
  msg.context = ctx;
  return fi_tsendmsg(ep(), &msg, 0);
}

}  // namespace nanoccl::fabric
