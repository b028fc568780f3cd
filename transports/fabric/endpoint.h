// The libfabric side of one fabric transport: the provider's settings (rxm's buffers, and so the
// frame size), the choice of provider and domain, and the objects opened on them (fabric,
// domain, completion queue, address vector, the FI_EP_RDM endpoint), with the two calls that put
// frames on the endpoint.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transports/fabric/wire.h"
#include "transports/transport.h"

namespace nanoccl::fabric {

// Sets rxm's buffer size and receive buffers per connection where the user has not (once per
// process, before libfabric first reads its environment), and returns the payload each frame
// carries: FI_OFI_RXM_BUFFER_SIZE less kFrameSlack (endpoint.cc: why 64 KiB). A process that
// initialised libfabric before with other values still works: frames then take rxm's slower
// protocols.
uint64_t providerDefaults();

// "<what>: <libfabric's text for -rc>".
std::string fiError(const char* what, ssize_t rc);

// Owned by one transport: open() (from listen()) and close() (from its destructor) run on the
// thread that calls them; connect() fills the address vector and posts the first receives
// before the progress thread starts, and from then on that thread alone posts operations and
// reads the completion queue, which any thread may signal (fi_cq_signal) to wake it.
class Endpoint {
 public:
  // Chooses the provider (FI_PROVIDER, else "tcp;ofi_rxm"; a TCP-based provider's domain on the
  // interface NANOCCL_SOCKET_IFNAME picks, as the tcp transport would), logs it once per
  // process, and opens the objects, the completion queue with `cqSize` entries. On failure,
  // what was opened stays until close().
  Status open(const TransportOptions& o, size_t cqSize);

  // The endpoint is closed first: the buffers its operations target may be freed after.
  void close();

  fid_ep* ep() const { return reinterpret_cast<fid_ep*>(ep_.get()); }  // null before open()
  fid_cq* cq() const { return reinterpret_cast<fid_cq*>(cq_.get()); }
  fid_av* av() const { return reinterpret_cast<fid_av*>(av_.get()); }
  const std::string& provider() const { return provider_; }
  const std::string& domainName() const { return domainName_; }
  // Whether the completion queue can block (fi_cq_sread, fi_cq_signal); if not, the progress
  // loop sleeps instead.
  bool canWait() const { return canWait_; }

  // Posts a receive of a frame (kTag) from anyone into `buf`; `ctx` comes back in its
  // completion. 0, or a negative fi_errno.
  ssize_t postRecv(void* buf, size_t bytes, fi_context* ctx);

  // Sends header `h` and `length` bytes at `payload` to `addr` as one tagged message. Where the
  // provider takes one iov, both are copied into `*scratch`; `h`, `payload` and `*scratch` stay
  // until the completion. 0, -FI_EAGAIN (the provider's queue is full: again after progress),
  // or another negative fi_errno.
  ssize_t send(fi_addr_t addr, WireHeader* h, const char* payload, size_t length,
               std::string* scratch, fi_context* ctx);

 private:
  struct FiDeleter {
    void operator()(fid* f) const {
      if (f != nullptr) fi_close(f);
    }
  };

  struct InfoDeleter {
    void operator()(fi_info* i) const;  // fi_freeinfo
  };

  std::unique_ptr<fi_info, InfoDeleter> info_;
  std::unique_ptr<fid, FiDeleter> fabric_, domain_, cq_, av_, ep_;
  std::string provider_ = "?";
  std::string domainName_;
  size_t iovLimit_ = 1;
  bool canWait_ = true;
};

}  // namespace nanoccl::fabric
