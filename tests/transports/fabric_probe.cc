// A helper for fabric_transport_test.cc: creates one fabric transport in a fresh process (so
// that FI_PROVIDER from its environment is what libfabric reads at its first use), calls
// listen(), and prints the Status. Exit code 0 when listen() succeeded.
#include <cstdio>

#include "transports/transport.h"

int main() {
  nanoccl::TransportOptions o;
  o.rank = 0;
  o.size = 2;
  o.commId = "probe";
  o.secret = "probe-secret";
  o.config.socketIfname = "lo";
  auto t = nanoccl::createTransport("fabric", o);
  if (!t.isOk()) {
    std::printf("%s\n", t.status().toString().c_str());
    return 1;
  }
  auto a = t.value()->listen();
  std::printf("%s\n", a.isOk() ? "listening" : a.status().toString().c_str());
  return a.isOk() ? 0 : 1;
}
