// A helper for fabric_transport_test.cc: fabric transports in fresh processes, so that what
// libfabric reads from the environment at its first use (FI_PROVIDER, FI_OFI_RXM_*) is this
// process's.
//   nanoccl_fabric_probe                 one transport: listen(), print the Status; exit 0 when
//                                        it listens
//   nanoccl_fabric_probe <rank> <dir>    rank 0 or 1 of a pair that meets through files in
//                                        <dir>: connect(), then rank 0 sends 1 MiB to rank 1,
//                                        which checks it; prints the Status; exit 0 when it
//                                        all worked
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "transports/transport.h"

namespace {

nanoccl::TransportOptions options(int rank) {
  nanoccl::TransportOptions o;
  o.rank = rank;
  o.size = 2;
  o.commId = "probe";
  o.secret = "probe-secret";
  o.config.socketIfname = "lo";
  return o;
}

int report(const nanoccl::Status& st, const char* ok) {
  std::printf("%s\n", st.isOk() ? ok : st.toString().c_str());
  // Now: under LeakSanitizer a leak libfabric leaves at exit (its rxm connections to a peer
  // that never answered) ends the process before stdio's buffers are flushed.
  std::fflush(stdout);
  return st.isOk() ? 0 : 1;
}

int pair(int rank, const std::string& dir) {
  using namespace nanoccl;
  auto t = createTransport("fabric", options(rank));
  if (!t.isOk()) return report(t.status(), "");
  auto a = t.value()->listen();
  if (!a.isOk()) return report(a.status(), "");
  std::ofstream(dir + "/addr" + std::to_string(rank) + ".tmp") << a.value();
  std::rename((dir + "/addr" + std::to_string(rank) + ".tmp").c_str(),
              (dir + "/addr" + std::to_string(rank)).c_str());
  std::vector<std::string> addrs(2);
  const Deadline deadline = Deadline::after(std::chrono::seconds(20));
  for (int r = 0; r < 2; ++r) {
    while (addrs[r].empty() && !deadline.expired()) {
      std::ifstream f(dir + "/addr" + std::to_string(r));
      std::stringstream ss;
      ss << f.rdbuf();
      addrs[r] = ss.str();
      if (addrs[r].empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  Status st = t.value()->connect(addrs, Deadline::after(std::chrono::seconds(5)));
  if (!st.isOk()) return report(st, "");
  std::vector<unsigned char> buf(1 << 20);
  Envelope env;
  env.fingerprint.op = OpType::kAllreduce;
  env.fingerprint.dtype = DataType::kUInt8;
  env.fingerprint.count = buf.size();
  env.fingerprint.seq = 1;
  if (rank == 0) {
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 7 + 1);
    st = t.value()->isend(1, env, buf.data(), buf.size())->wait(deadline);
  } else {
    st = t.value()->irecv(0, env, buf.data(), buf.size())->wait(deadline);
    for (size_t i = 0; st.isOk() && i < buf.size(); ++i) {
      if (buf[i] != static_cast<unsigned char>(i * 7 + 1)) st = internalError("wrong byte");
    }
  }
  return report(st, "delivered");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3) return pair(std::atoi(argv[1]), argv[2]);
  auto t = nanoccl::createTransport("fabric", options(0));
  if (!t.isOk()) return report(t.status(), "");
  auto a = t.value()->listen();
  return report(a.status(), "listening");
}
