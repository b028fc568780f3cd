#include "collectives/connect.h"

#include <numeric>

#include "collectives/store.h"
#include "transports/netif.h"

namespace nanoccl::detail {
namespace {

std::string ranksText(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ' ';
    s += std::to_string(r);
  }
  return s;
}

TransportOptions transportOptions(const std::string& commId, int rank, int size,
                                  const std::string& secret, const CommunicatorOptions& options) {
  TransportOptions topts;
  topts.rank = rank;
  topts.size = size;
  topts.commId = commId;
  topts.secret = secret;
  topts.config = options.config;
  return topts;
}

// What a rank whose transport cannot be set up publishes instead of its address: its peers,
// waiting for that address, then fail at once with its reason rather than at the deadline.
constexpr const char* kSetupFailed = "setup-failed:";

Status publishFailure(const std::string& commId, int rank, const CommunicatorOptions& options,
                      const Status& why) {
  PrefixStore store("nanoccl/" + commId, options.store);
  (void)store.set("addr/" + std::to_string(rank), kSetupFailed + why.message());
  return why;
}

// For the group whose members are the parent ranks `ranks` (this rank is `rank` among them):
// publishes `transport`'s address under "nanoccl/<commId>/addr/<rank>", reads every member's
// and connects the full mesh. `localRanks`, for a main transport that does not route: the
// ranks of this node, whose addresses must then be plain too (routed::plainAddresses).
Status publishAndConnect(Transport& transport, const std::string& commId, int rank,
                         const std::vector<int>& ranks, const CommunicatorOptions& options,
                         const Deadline& deadline, const std::vector<int>* localRanks = nullptr) {
  PrefixStore store("nanoccl/" + commId, options.store);
  Result<std::string> listening = transport.listen();
  if (!listening.isOk()) return publishFailure(commId, rank, options, listening.status());
  const std::string& address = listening.value();
  NANOCCL_CHECK(store.set("addr/" + std::to_string(rank), address));
  std::vector<std::string> addresses(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    Result<std::string> a = store.get("addr/" + std::to_string(i), deadline);
    if (!a.isOk()) {
      return a.status().withContext("waiting for rank " + std::to_string(ranks[i]) +
                                    "'s address: ");
    }
    addresses[i] = std::move(a).value();
    if (addresses[i].rfind(kSetupFailed, 0) == 0) {
      return peerError("rank " + std::to_string(ranks[i]) + " could not set up its transport: " +
                       addresses[i].substr(std::string(kSetupFailed).size()));
    }
  }
  if (localRanks != nullptr) {
    NANOCCL_ASSIGN_OR_RETURN(addresses, routed::plainAddresses(addresses, rank, *localRanks));
  }
  return transport.connect(addresses, deadline);
}

// `t`, or what CommunicatorOptions::wrapTransport makes of it (tests).
std::unique_ptr<Transport> wrapped(std::unique_ptr<Transport> t,
                                   const CommunicatorOptions& options) {
  return options.wrapTransport ? options.wrapTransport(std::move(t)) : std::move(t);
}

// Creates a `kind` transport for the group of parent ranks `ranks` and connects it.
Result<std::unique_ptr<Transport>> connectGroup(const std::string& kind, const std::string& commId,
                                                int rank, const std::vector<int>& ranks,
                                                const std::string& secret,
                                                const CommunicatorOptions& options,
                                                const Deadline& deadline) {
  Result<std::unique_ptr<Transport>> made = createTransport(
      kind, transportOptions(commId, rank, static_cast<int>(ranks.size()), secret, options));
  if (!made.isOk()) return publishFailure(commId, rank, options, made.status());
  std::unique_ptr<Transport> transport = wrapped(std::move(made).value(), options);
  NANOCCL_CHECK(publishAndConnect(*transport, commId, rank, ranks, options, deadline));
  return transport;
}

}  // namespace

namespace {

// NANOCCL_RAIL_PER_LOCAL_RANK: `config` narrowed to rail localRank % rails of its
// socket_ifname (the same index on every node, so a cross group agrees on one rail).
Result<Config> oneRail(const Config& config, int localRank) {
  NANOCCL_ASSIGN_OR_RETURN(const std::vector<InterfaceAddress> rails,
                           pickRails(config.socketIfname));
  const size_t k = static_cast<size_t>(localRank) % rails.size();
  Config out = config;
  out.socketIfname = "=" + rails[k].name;
  if (config.railMbps.size() == rails.size()) out.railMbps = {config.railMbps[k]};
  return out;
}

}  // namespace

// The transport between all ranks: choice.interNode, routed through choice.intraNode for the
// collective messages between ranks of this node where they differ. Every rank of a node
// decides alike (same topology, same build, same settings). Ranks that do not route (alone on
// their node, or told so) publish a plain address and use the remote part of routed ranks'
// addresses.
Result<std::unique_ptr<Transport>> connectMain(const CommunicatorOptions& options,
                                               const TransportChoice& choice,
                                               const Topology& topo, const std::string& secret,
                                               const Deadline& deadline,
                                               routed::RoutedTransport** routedOut) {
  std::vector<int> all(options.size);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<int>& mine = topo.nodeRanks[topo.nodeOf[options.rank]];
  const bool route = mine.size() > 1 && choice.intraNode != choice.interNode;
  if (!route) {
    Result<std::unique_ptr<Transport>> made = createTransport(
        choice.interNode,
        transportOptions(options.commId, options.rank, options.size, secret, options));
    if (!made.isOk()) return publishFailure(options.commId, options.rank, options, made.status());
    std::unique_ptr<Transport> t = wrapped(std::move(made).value(), options);
    NANOCCL_CHECK(
        publishAndConnect(*t, options.commId, options.rank, all, options, deadline, &mine));
    return t;
  }
  routed::RouteOptions ro;
  ro.localRanks = mine;
  ro.remote = choice.interNode;
  ro.local = choice.intraNode;
  ro.fallback = choice.intraFallback;  // e.g. a /dev/shm too small: this node stays on remote
  Result<std::unique_ptr<routed::RoutedTransport>> made = routed::createRoutedTransport(
      transportOptions(options.commId, options.rank, options.size, secret, options), ro);
  if (!made.isOk()) {
    return publishFailure(options.commId, options.rank, options,
                          made.status().withContext("NANOCCL_INTRA_TRANSPORT=" +
                                                    options.config.intraTransport +
                                                    ": collectives within this node over " +
                                                    choice.intraNode + ": "));
  }
  routed::RoutedTransport* routed = made.value().get();
  std::unique_ptr<Transport> t = wrapped(std::move(made).value(), options);
  NANOCCL_CHECK(publishAndConnect(*t, options.commId, options.rank, all, options, deadline));
  *routedOut = routed;
  return t;
}

// The groups of a hierarchical topology (see Hierarchy in algorithm.h). They ride `main`,
// except a cross group on a rail of its own (NANOCCL_RAIL_PER_LOCAL_RANK over tcp), which
// connects its own transport: every rank of a cross group decides alike, and the groups are
// disjoint, so each only waits for its own members and setup cannot deadlock.
Result<std::unique_ptr<Hierarchy>> connectHierarchy(const CommunicatorOptions& options,
                                                    const TransportChoice& choice,
                                                    const Topology& topo, Transport* main,
                                                    const std::string& secret,
                                                    const Deadline& deadline) {
  auto h = std::make_unique<Hierarchy>();
  h->topology = topo;
  h->shards = topo.minLocalSize();
  h->helper = std::make_unique<StageHelper>();
  const int node = topo.nodeOf[options.rank];
  const int lr = topo.localRankOf[options.rank];

  SubGroup& local = h->local;
  local.ranks = topo.nodeRanks[node];
  local.rank = lr;
  local.size = static_cast<int>(local.ranks.size());
  local.name = "intra-node stage among ranks " + ranksText(local.ranks) + " (node " +
               std::to_string(node) + ")";
  if (local.size > 1) local.transport = main;

  // Only local ranks below the smallest node's size carry a shard across nodes.
  if (lr < h->shards) {
    SubGroup& cross = h->cross;
    for (int k = 0; k < topo.numNodes(); ++k) cross.ranks.push_back(topo.nodeRanks[k][lr]);
    cross.rank = node;
    cross.size = topo.numNodes();
    // On its own transport the members are numbered by their place in the group; the name
    // says so.
    const bool ownRail = options.config.railPerLocalRank && choice.interNode == "tcp";
    cross.name = "inter-node stage among ranks " + ranksText(cross.ranks) + " (local rank " +
                 std::to_string(lr) + " of every node" +
                 (ownRail ? "; below, rank i is the i-th of them, on its own rail)" : ")");
    if (!ownRail) {
      cross.transport = main;
      return h;
    }
    CommunicatorOptions crossOptions = options;
    NANOCCL_ASSIGN_OR_RETURN(crossOptions.config, oneRail(options.config, lr));
    Result<std::unique_ptr<Transport>> t =
        connectGroup(choice.interNode, options.commId + "/cross/" + std::to_string(lr), node,
                     cross.ranks, secret, crossOptions, deadline);
    if (!t.isOk()) {
      return t.status().withContext("connecting the " + cross.name + " over " + choice.interNode +
                                    ": ");
    }
    cross.own = std::move(t).value();
    cross.transport = cross.own.get();
  }
  return h;
}

}  // namespace nanoccl::detail
