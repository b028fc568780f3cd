#include "collectives/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>

namespace nanoccl {

Topology Topology::fromNodeIds(std::vector<std::string> ids) {
  Topology t;
  t.nodeIds = std::move(ids);
  const int n = static_cast<int>(t.nodeIds.size());
  t.nodeOf.resize(n);
  t.localRankOf.resize(n);
  std::map<std::string, int> index;
  for (int r = 0; r < n; ++r) {
    // Ranks are visited in order, so a node's index is fixed by its lowest rank.
    auto [it, added] = index.emplace(t.nodeIds[r], t.numNodes());
    if (added) t.nodeRanks.emplace_back();
    const int node = it->second;
    t.nodeOf[r] = node;
    t.localRankOf[r] = t.localSize(node);
    t.nodeRanks[node].push_back(r);
  }
  return t;
}

Topology Topology::singleNode(int size) {
  return fromNodeIds(std::vector<std::string>(size, "node"));
}

int Topology::minLocalSize() const {
  int m = 0;
  for (const auto& ranks : nodeRanks) {
    const int s = static_cast<int>(ranks.size());
    m = m == 0 ? s : std::min(m, s);
  }
  return m;
}

int Topology::maxLocalSize() const {
  int m = 0;
  for (const auto& ranks : nodeRanks) m = std::max(m, static_cast<int>(ranks.size()));
  return m;
}

bool Topology::hierarchical() const { return numNodes() > 1 && maxLocalSize() > 1; }

std::string Topology::describe() const {
  std::string s = std::to_string(numNodes()) + (numNodes() == 1 ? " node:" : " nodes:");
  for (const auto& ranks : nodeRanks) {
    s += " [";
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (i > 0) s += ' ';
      s += std::to_string(ranks[i]);
    }
    s += "]";
  }
  return s;
}

std::string defaultNodeId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string id = host[0] != '\0' ? host : "unknown-host";
  struct stat st {};
  if (stat("/proc/self/ns/net", &st) == 0) {
    id += "/netns:" + std::to_string(static_cast<unsigned long long>(st.st_ino));
  }
  return id;
}

}  // namespace nanoccl
