// A stranger's bytes at a rank's door. Rank 0 of a 2-rank job listens; a raw socket sends the
// input as "rank 1" and hangs up. Whatever it sends, setup must end in a timeout (nobody who
// proved the secret came), never admit it, crash, or allocate from its numbers. A Challenge
// that comes back must verify under the job key only (the acceptor never signs for a wrong
// one).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>

#include "common/secret.h"
#include "transports/tcp/address.h"
#include "transports/tcp/handshake.h"
#include "transports/tcp/wire.h"

namespace {

int dial(const nanoccl::SocketAddress& a) {
  const int fd = socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nanoccl;
  static auto listeners = tcp::openListeners("lo");
  if (!listeners.isOk() || listeners->size() != 1) __builtin_trap();
  const tcp::Listener& listener = listeners->front();
  tcp::MeshParams p{CommIdentity("fuzz-job-secret-0123456789", "fuzz")};
  p.rank = 0;
  p.size = 2;
  p.nsocks = 1;
  std::thread stranger([&] {
    const int fd = dial(listener.address);
    if (fd < 0) return;
    (void)send(fd, data, size, MSG_NOSIGNAL);
    pollfd pf{fd, POLLIN, 0};
    // Read whatever comes back (a Challenge for a well-formed Hello) until the door closes.
    char buf[512];
    while (poll(&pf, 1, 10) > 0 && recv(fd, buf, sizeof(buf), 0) > 0) {
    }
    close(fd);
  });
  auto mesh = tcp::buildMesh(listeners.value(), {listener.address.toString(), "127.0.0.1:1"}, p,
                             Deadline::after(std::chrono::milliseconds(20)));
  stranger.join();
  if (mesh.isOk()) __builtin_trap();  // admitted without proving the secret
  if (mesh.status().code() != StatusCode::kTimeout) __builtin_trap();
  return 0;
}
