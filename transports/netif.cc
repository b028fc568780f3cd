#include "transports/netif.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "common/strings.h"

namespace nanoccl {

std::string SocketAddress::toString() const {
  char host[INET6_ADDRSTRLEN] = {0};
  if (family() == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    std::string out(host);  // appended piecewise: GCC 12 misreads operator+ here (-Wrestrict)
    out += ':';
    out += std::to_string(ntohs(a->sin_port));
    return out;
  }
  if (family() == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    std::string h(host);
    if (a->sin6_scope_id != 0) h += "%" + std::to_string(a->sin6_scope_id);
    return "[" + h + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  return "<no address>";
}

Result<SocketAddress> SocketAddress::parse(const std::string& text) {
  const auto bad = [&] { return invalidArgument("bad socket address '" + text + "'"); };
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 >= text.size()) return bad();
  const std::string portText = text.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(portText.c_str(), &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) return bad();
  std::string host = text.substr(0, colon);
  SocketAddress out;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    uint32_t scope = 0;
    if (const size_t pct = host.find('%'); pct != std::string::npos) {
      scope = static_cast<uint32_t>(std::strtoul(host.c_str() + pct + 1, nullptr, 10));
      host.resize(pct);
    }
    auto* a = reinterpret_cast<sockaddr_in6*>(&out.storage);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    a->sin6_scope_id = scope;
    if (inet_pton(AF_INET6, host.c_str(), &a->sin6_addr) != 1) return bad();
    out.length = sizeof(sockaddr_in6);
    return out;
  }
  auto* a = reinterpret_cast<sockaddr_in*>(&out.storage);
  a->sin_family = AF_INET;
  a->sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a->sin_addr) != 1) return bad();
  out.length = sizeof(sockaddr_in);
  return out;
}

void SocketAddress::setPort(uint16_t port) {
  if (family() == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  } else if (family() == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
  }
}

namespace {

// A NANOCCL_SOCKET_IFNAME spec taken apart: "^=eth0,eth1" -> exclude, exact, {eth0, eth1}.
struct InterfaceSpec {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> items;  // empty items dropped

  static InterfaceSpec parse(const std::string& spec) {
    InterfaceSpec out;
    size_t pos = 0;
    out.exclude = pos < spec.size() && spec[pos] == '^';
    if (out.exclude) ++pos;
    out.exact = pos < spec.size() && spec[pos] == '=';
    if (out.exact) ++pos;
    for (std::string& item : splitList(spec.substr(pos))) {
      if (!item.empty()) out.items.push_back(std::move(item));
    }
    return out;
  }

  // Whether `name` is the interface `item` names (exact) or starts with it (a prefix).
  bool names(const std::string& name, const std::string& item) const {
    return exact ? name == item : name.compare(0, item.size(), item) == 0;
  }
};

}  // namespace

bool interfaceMatches(const std::string& name, const std::string& spec) {
  if (spec.empty()) return true;
  const InterfaceSpec s = InterfaceSpec::parse(spec);
  const bool listed = std::any_of(s.items.begin(), s.items.end(),
                                  [&](const std::string& item) { return s.names(name, item); });
  return s.exclude ? !listed : listed;
}

Result<std::vector<InterfaceAddress>> upInterfaces() {
  ifaddrs* raw = nullptr;
  if (getifaddrs(&raw) != 0) return systemError("getifaddrs", errno);
  std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> list(raw, freeifaddrs);
  std::vector<InterfaceAddress> out;
  for (const int family : {AF_INET, AF_INET6}) {
    for (const ifaddrs* i = raw; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != family) continue;
      if ((i->ifa_flags & IFF_UP) == 0) continue;
      if (family == AF_INET6) {
        // Link-local IPv6 needs a scope and is rarely what a cluster wants.
        const auto* a6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
        if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;
      }
      InterfaceAddress a;
      a.name = i->ifa_name;
      a.running = (i->ifa_flags & IFF_RUNNING) != 0;
      const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      std::memcpy(&a.address.storage, i->ifa_addr, len);
      a.address.length = len;
      a.address.setPort(0);
      out.push_back(std::move(a));
    }
  }
  return out;
}

namespace {

Result<InterfaceAddress> pickFrom(const std::string& spec,
                                  const std::vector<InterfaceAddress>& seen) {
  // Without a spec, loopback and docker bridges are the last resort, as in NCCL.
  const std::string effective = spec.empty() ? "^docker,lo" : spec;
  for (const InterfaceAddress& a : seen) {
    if (interfaceMatches(a.name, effective)) return a;
  }
  if (spec.empty()) return pickFrom("=lo", seen);
  std::string names;
  for (const InterfaceAddress& a : seen) {
    if (a.address.family() != AF_INET) continue;
    if (!names.empty()) names += ", ";
    names += a.name;
  }
  return unavailableError("no network interface that is up matches NANOCCL_SOCKET_IFNAME='" +
                          spec + "' (interfaces with IPv4 addresses: " + names + ")");
}

}  // namespace

Result<std::vector<InterfaceAddress>> pickRails(const std::string& spec,
                                                const std::vector<InterfaceAddress>& seen) {
  if (spec.empty() || spec[0] == '^') {
    NANOCCL_ASSIGN_OR_RETURN(InterfaceAddress one, pickFrom(spec, seen));
    return std::vector<InterfaceAddress>{std::move(one)};
  }
  const InterfaceSpec parsed = InterfaceSpec::parse(spec);
  std::vector<InterfaceAddress> rails;
  for (const std::string& item : parsed.items) {
    std::vector<const InterfaceAddress*> matched;  // the item's interfaces, first address each
    for (const InterfaceAddress& a : seen) {
      if (!a.running || a.name.find(':') != std::string::npos) continue;
      if (!parsed.names(a.name, item)) continue;
      const auto taken = [&](const InterfaceAddress* r) { return r->name == a.name; };
      if (std::none_of(matched.begin(), matched.end(), taken)) matched.push_back(&a);
    }
    std::sort(matched.begin(), matched.end(),
              [](const InterfaceAddress* x, const InterfaceAddress* y) { return x->name < y->name; });
    for (const InterfaceAddress* a : matched) {
      const auto taken = [&](const InterfaceAddress& r) { return r.name == a->name; };
      if (std::none_of(rails.begin(), rails.end(), taken)) rails.push_back(*a);
    }
  }
  if (rails.empty()) {
    // Nothing matched: pickFrom() fails the same way, naming the interfaces there are.
    NANOCCL_ASSIGN_OR_RETURN(InterfaceAddress one, pickFrom(spec, seen));
    rails.push_back(std::move(one));
  }
  return rails;
}

Result<std::vector<InterfaceAddress>> pickRails(const std::string& spec) {
  NANOCCL_ASSIGN_OR_RETURN(const std::vector<InterfaceAddress> seen, upInterfaces());
  return pickRails(spec, seen);
}

int64_t interfaceMbps(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return 0;
  std::ifstream f("/sys/class/net/" + name + "/speed");
  int64_t mbps = 0;
  if (!(f >> mbps) || mbps <= 0) return 0;  // unreadable (EINVAL on loopback), or -1: unknown
  return std::min(mbps, kMaxRailMbps);
}

}  // namespace nanoccl
