// Topology: which ranks of a communicator share a node.
//
// Each rank publishes a node id (an opaque string) when the communicator is created; ranks with
// equal ids are one node. Nodes are numbered by their lowest rank and local ranks follow the
// global rank order within a node, so every rank derives the same Topology from the same ids
// without talking further. A Topology is a value: immutable once built, readable from any
// thread.
//
// Where a rank's node id comes from (first match wins, see Communicator::create):
//   NANOCCL_NODE_ID (Config::nodeId)   the user, or the emulated cluster, says so
//   CommunicatorOptions::nodeId        the embedding layer (the torch backend) says so
//   defaultNodeId()                    the host name and network namespace of this process
#pragma once

#include <string>
#include <vector>

namespace nanoccl {

struct Topology {
  std::vector<std::string> nodeIds;         // per rank
  std::vector<int> nodeOf;                  // node index per rank
  std::vector<int> localRankOf;             // rank within its node, per rank
  std::vector<std::vector<int>> nodeRanks;  // per node: its ranks, ascending

  // Groups ranks by id; ids[r] is rank r's node id.
  static Topology fromNodeIds(std::vector<std::string> ids);
  // `size` ranks on one node (what a communicator of threads or of one host sees).
  static Topology singleNode(int size);

  int size() const { return static_cast<int>(nodeOf.size()); }
  int numNodes() const { return static_cast<int>(nodeRanks.size()); }
  int localSize(int node) const { return static_cast<int>(nodeRanks[node].size()); }
  int minLocalSize() const;
  int maxLocalSize() const;
  bool sameNode(int a, int b) const { return nodeOf[a] == nodeOf[b]; }
  // More than one node, and a node with more than one rank: only then does a collective have
  // an intra-node stage and an inter-node stage to split into.
  bool hierarchical() const;
  // "2 nodes: [0 1] [2]" for logs and error messages.
  std::string describe() const;
};

// This process's node id: "<hostname>/netns:<inode of /proc/self/ns/net>", so that ranks in
// different network namespaces of one machine (an emulated cluster) are different nodes. The
// same form as backend/node_identity.cc's last rule.
std::string defaultNodeId();

}  // namespace nanoccl
