// The tuner's link probes (collectives/tuning_probe.h): ping-pongs and bulk transfers between
// rank pairs and whole nodes, over the groups the calls use, timed by one rank of each pair
// and handed to rank 0 through the store.
#include "collectives/tuning_probe.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "collectives/algorithm.h"

namespace nanoccl::tuning_probe {
namespace {

using Clock = std::chrono::steady_clock;

// Every probe runs as call #0 of the transports it uses (real calls start at #1), with tags
// unique per transport, so its messages can never meet a real call's.

constexpr int kPings = 16;
constexpr uint32_t kPingTag = 0;       // [0, kPings)
constexpr uint32_t kPairBulkTag = 100;  // [100, 100 + kBulks)
constexpr uint32_t kNodeBulkTag = 200;  // [200, 205)
constexpr uint32_t kBarrierTag = 1000;  // + 32 x barrier + round
constexpr int kBulks = 2;
constexpr size_t kInterBulkBytes = size_t{4} << 20;
constexpr size_t kIntraBulkBytes = size_t{16} << 20;
constexpr size_t kMaxNodeBulkBytes = size_t{32} << 20;
constexpr double kNodeProbeSeconds = 0.03;

// Empty barriers timed before each node probe; the fastest is what the probe's own closing
// barrier costs.
constexpr int kEmptyBarriers = 3;

struct Probe {
  double alphaUs = 0;   // half the median round trip of 8 bytes (0 when not pinged)
  double seconds = 0;   // the last bulk transfer, less one round trip
};

// Ranks `a` (who times) and `b` of `ctx`: `pings` round trips, then `bulks` transfers of
// `bytes` from a to b, each answered by an empty message. Other ranks do nothing.
Result<Probe> probePair(detail::Context& ctx, int a, int b, int pings, size_t bytes,
                        uint32_t bulkTag, int bulks = kBulks) {
  const int me = ctx.rank();
  if (me != a && me != b) return Probe{};
  const int peer = me == a ? b : a;
  char* buf = ctx.scratch(std::max<size_t>(bytes, 8));
  std::fill(buf, buf + std::max<size_t>(bytes, 8), 0);
  std::vector<double> rtts;
  for (int i = 0; i < pings; ++i) {
    const uint32_t tag = kPingTag + static_cast<uint32_t>(i);
    const Clock::time_point t0 = Clock::now();
    if (me == a) {
      detail::Pending rx = ctx.irecv(peer, tag, buf, 8);
      NANOCCL_CHECK(ctx.wait(ctx.isend(peer, tag, buf, 8)));
      NANOCCL_CHECK(ctx.wait(rx));
      rtts.push_back(secondsSince(t0));
    } else {
      NANOCCL_CHECK(ctx.wait(ctx.irecv(peer, tag, buf, 8)));
      NANOCCL_CHECK(ctx.wait(ctx.isend(peer, tag, buf, 8)));
    }
  }
  Probe out;
  double rtt = 0;
  if (!rtts.empty()) {
    std::sort(rtts.begin(), rtts.end());
    rtt = rtts[rtts.size() / 2];
    out.alphaUs = rtt / 2 * 1e6;
  }
  for (int k = 0; k < bulks; ++k) {
    const uint32_t tag = bulkTag + static_cast<uint32_t>(k);
    if (me == a) {
      const Clock::time_point t0 = Clock::now();
      detail::Pending ack = ctx.irecv(peer, tag, detail::ackSink(), 0);
      NANOCCL_CHECK(ctx.wait(ctx.isend(peer, tag, buf, bytes)));
      NANOCCL_CHECK(ctx.wait(ack));
      const double t = secondsSince(t0);
      // The last transfer counts: the first one pays TCP's slow start, and a token-bucket
      // shaper's burst (an idle link's credit) would make the first look faster than the
      // link is.
      out.seconds = std::max(t - rtt, t / 2);
    } else {
      NANOCCL_CHECK(ctx.wait(ctx.irecv(peer, tag, buf, bytes)));
      NANOCCL_CHECK(ctx.wait(ctx.isend(peer, tag, detail::kAckByte, 0)));
    }
  }
  return out;
}

// Every rank of `ctx` (dissemination); `which` numbers the barriers of the probe.
Status barrier(detail::Context& ctx, uint32_t which) {
  const int n = ctx.size();
  const int r = ctx.rank();
  char* in = ctx.scratch(32);
  static const char kToken = 1;
  uint32_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, ++round) {
    const uint32_t tag = kBarrierTag + 32 * which + round;
    detail::Pending rx = ctx.irecv((r - dist + n) % n, tag, in + round, 1);
    NANOCCL_CHECK(ctx.wait(ctx.isend((r + dist) % n, tag, &kToken, 1)));
    NANOCCL_CHECK(ctx.wait(rx));
  }
  return Status::ok();
}

Status publish(Store& store, const std::string& key, double value) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  return store.set("tune/" + key, buf);
}

Result<double> fetch(Store& store, const std::string& key, const Deadline& deadline) {
  NANOCCL_ASSIGN_OR_RETURN(std::string v, store.get("tune/" + key, deadline));
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (*end != '\0' || !std::isfinite(x)) return protocolError("tune/" + key + ": not a number");
  return x;
}

// What the timing rank of a pair probe tells rank 0, under "<cls>/" ("inter", "intra").
Status publishPair(Store& store, const std::string& cls, const Probe& p) {
  NANOCCL_CHECK(publish(store, cls + "/alpha_us", p.alphaUs));
  return publish(store, cls + "/pair_s", p.seconds);
}

// Rank 0: a link class from what its pair probe published (`bulkBytes` a transfer).
Result<LinkClassProfile> collectPair(Store& store, const std::string& cls, size_t bulkBytes,
                                     const Deadline& deadline) {
  LinkClassProfile c;
  c.present = true;
  NANOCCL_ASSIGN_OR_RETURN(c.alphaUs, fetch(store, cls + "/alpha_us", deadline));
  NANOCCL_ASSIGN_OR_RETURN(const double pair, fetch(store, cls + "/pair_s", deadline));
  c.pairMBps = static_cast<double>(bulkBytes) / pair / 1e6;
  c.nodeMBps = c.pairMBps;
  return c;
}

// The probes' transports, one Context each (call #0; real calls start at #1).
struct ProbeContexts {
  std::unique_ptr<detail::Context> main;
  std::unique_ptr<detail::Context> cross;  // this rank's shard across nodes, where it has one
  std::unique_ptr<detail::Context> local;  // this rank's node, where it has a local group
  std::unique_ptr<detail::Context> oneSocket;  // the inter-node one, one connection a peer

  // After a failed probe: ends what is still in flight before the scratch memory goes, and
  // keeps (leaks) the memory a stuck transfer may still target.
  void abandon(const TuningTarget& t, const Status& why) {
    if (t.main != nullptr) t.main->abort(why);
    if (const detail::Hierarchy* h = t.hierarchy; h != nullptr && h->cross.own) {
      h->cross.own->abort(why);
    }
    for (auto* ctx : {main.get(), cross.get(), local.get(), oneSocket.get()}) {
      if (ctx == nullptr) continue;
      detail::Context::Leftover left = ctx->takeUnfinished();
      if (left.requests.empty()) {
        continue;
      }
      for (detail::ScratchPool::Block& b : left.scratch) (void)b.mem.release();
    }
  }
};

// The probes, on every rank; rank 0 returns the link classes (others: empty classes).
Result<LinkProfile> probeLinks(Store& store, const TuningTarget& t, ProbeContexts& ctxs,
                               const Deadline& deadline) {
  const Topology& topo = *t.topology;
  const detail::Hierarchy* h = t.hierarchy;
  detail::Context& main = *ctxs.main;
  uint32_t barriers = 0;
  const auto sync = [&] { return barrier(main, barriers++); };

  LinkProfile out;
  if (topo.numNodes() >= 2) {
    // Inter-node: node 0 and node 1. On a hierarchical topology local rank s of each node
    // talks over its cross group (node index = cross rank); first shard 0 alone (latency and
    // one pair), then every shard at once (what a node's link carries in a hierarchical call).
    // On a flat one (one rank a node), global ranks 0 and 1.
    const int shard = h != nullptr ? topo.localRankOf[t.rank] : 0;
    const int shards = h != nullptr ? h->shards : 1;
    detail::Context* inter = h != nullptr ? ctxs.cross.get() : &main;
    NANOCCL_CHECK(sync());
    if (inter != nullptr && shard == 0) {
      NANOCCL_ASSIGN_OR_RETURN(Probe p,
                               probePair(*inter, 0, 1, kPings, kInterBulkBytes, kPairBulkTag));
      if (inter->rank() == 0) NANOCCL_CHECK(publishPair(store, "inter", p));
    }
    // Every shard at once, timed by rank 0 from one barrier to the next (less what an empty
    // pair of barriers takes): each shard's own timer would also count the time it ran alone.
    // A first, untimed transfer warms every shard's connections.
    // Each shard sends what one pair moves in ~30 ms (rank 0 says how much): on fast links a
    // fixed 4 MB took a few ms, no more than the barriers around it on a busy machine.
    // Then the same over one connection a peer (tcp with several): the planner's socket count.
    const bool sockets = t.transport == "tcp" && t.config->nsocks > 1;
    double nodeSeconds = 0;
    double oneSocketSeconds = 0;
    size_t nodeBytes = kInterBulkBytes;
    if (shards > 1 || sockets) {
      if (t.rank == 0) {
        NANOCCL_ASSIGN_OR_RETURN(const double pair, fetch(store, "inter/pair_s", deadline));
        const double want = static_cast<double>(kInterBulkBytes) / pair * kNodeProbeSeconds;
        nodeBytes = std::clamp<size_t>(static_cast<size_t>(want) >> 20 << 20, kInterBulkBytes,
                                       kMaxNodeBulkBytes);
        NANOCCL_CHECK(publish(store, "inter/node_bytes", static_cast<double>(nodeBytes)));
      } else {
        NANOCCL_ASSIGN_OR_RETURN(const double b, fetch(store, "inter/node_bytes", deadline));
        nodeBytes = static_cast<size_t>(b);
      }
      NANOCCL_CHECK(sync());
      if (inter != nullptr) {
        NANOCCL_CHECK(probePair(*inter, 0, 1, 0, nodeBytes, kNodeBulkTag, 1).status());
      }
      // Every shard at once on `ctx`, timed by rank 0 from one barrier to the next, less the
      // fastest of kEmptyBarriers empty barriers (transferSeconds). With one, a slow empty
      // barrier made the transfer look faster than the link: at 10 Gbit/s (1250 MB/s) node
      // rates of 1402-8442 MB/s were measured on the busy 2-core machine (results/tuning).
      const auto allShards = [&](detail::Context* ctx, uint32_t tag) -> Result<double> {
        NANOCCL_CHECK(sync());
        std::vector<double> empty;
        for (int i = 0; i < kEmptyBarriers; ++i) {
          const Clock::time_point t0 = Clock::now();
          NANOCCL_CHECK(sync());
          empty.push_back(secondsSince(t0));
        }
        const Clock::time_point t0 = Clock::now();
        if (ctx != nullptr) NANOCCL_CHECK(probePair(*ctx, 0, 1, 0, nodeBytes, tag, 1).status());
        NANOCCL_CHECK(sync());
        return transferSeconds(secondsSince(t0), empty);
      };
      NANOCCL_ASSIGN_OR_RETURN(nodeSeconds, allShards(inter, kNodeBulkTag + 1));
      if (sockets) {
        // Twice each, all connections then one, one, all, and the faster of each: one such
        // transfer varied by ~15% on the busy 2-core machine (results/tuning), more than the
        // gain the socket count is decided by (planner.h), and picked two connections a peer
        // for int8 calls at 1 Gbit/s that ran 5-10% slower than one. The order keeps a steady
        // drift of the machine off either side.
        if (inter != nullptr) ctxs.oneSocket = inter->withLanes(1);
        detail::Context* one = ctxs.oneSocket.get();
        NANOCCL_ASSIGN_OR_RETURN(oneSocketSeconds, allShards(one, kNodeBulkTag + 2));
        NANOCCL_ASSIGN_OR_RETURN(const double oneAgain, allShards(one, kNodeBulkTag + 3));
        NANOCCL_ASSIGN_OR_RETURN(const double allAgain, allShards(inter, kNodeBulkTag + 4));
        oneSocketSeconds = std::min(oneSocketSeconds, oneAgain);
        nodeSeconds = std::min(nodeSeconds, allAgain);
      }
    }
    NANOCCL_CHECK(sync());
    if (t.rank == 0) {
      NANOCCL_ASSIGN_OR_RETURN(out.inter, collectPair(store, "inter", kInterBulkBytes, deadline));
      const double moved = static_cast<double>(nodeBytes) * shards / 1e6;
      if (shards > 1 || sockets) out.inter.nodeMBps = moved / nodeSeconds;
      if (sockets) out.inter.oneSocketMBps = moved / oneSocketSeconds;
    }
  }
  // Intra-node: local ranks 0 and 1 of the first node with two ranks, over the transport the
  // collectives of a node use (the hierarchy's local group; the main one on a single node).
  int firstPair = -1;
  for (int n = 0; n < topo.numNodes() && firstPair < 0; ++n) {
    if (topo.localSize(n) >= 2) firstPair = n;
  }
  if (firstPair >= 0) {
    NANOCCL_CHECK(sync());
    if (topo.nodeOf[t.rank] == firstPair) {
      detail::Context* intra = h != nullptr ? ctxs.local.get() : &main;
      const int a = h != nullptr ? 0 : topo.nodeRanks[firstPair][0];
      const int b = h != nullptr ? 1 : topo.nodeRanks[firstPair][1];
      NANOCCL_ASSIGN_OR_RETURN(Probe p,
                               probePair(*intra, a, b, kPings, kIntraBulkBytes, kPairBulkTag + 50));
      if (intra->rank() == a) NANOCCL_CHECK(publishPair(store, "intra", p));
    }
    NANOCCL_CHECK(sync());
    if (t.rank == 0) {
      NANOCCL_ASSIGN_OR_RETURN(out.intra, collectPair(store, "intra", kIntraBulkBytes, deadline));
    }
  }
  return out;
}

}  // namespace

double transferSeconds(double timed, const std::vector<double>& emptyBarriers) {
  double barrier = timed;
  for (double e : emptyBarriers) barrier = std::min(barrier, e);
  if (emptyBarriers.empty()) barrier = 0;
  return std::max(timed - barrier, 1e-6);
}

Result<LinkProfile> probeLinks(Store& store, const TuningTarget& t, const Deadline& deadline) {
  OpFingerprint fp;
  fp.op = OpType::kBarrier;
  fp.seq = 0;
  const Config& config = *t.config;
  ProbeContexts ctxs;
  ctxs.main = std::make_unique<detail::Context>(t.main, t.rank, t.size, fp, deadline, t.timeout,
                                                config);
  if (const detail::Hierarchy* h = t.hierarchy) {
    // The groups' contexts, their peers named as on their transport (SubGroup).
    const auto group = [&](const detail::SubGroup& g) {
      auto c = std::make_unique<detail::Context>(g.transport, g.rank, g.size, fp, deadline,
                                                 t.timeout, config);
      c->setPeerRanks(g.peerRanks());
      return c;
    };
    if (h->cross.transport != nullptr) ctxs.cross = group(h->cross);
    if (h->local.transport != nullptr) ctxs.local = group(h->local);
  }
  Result<LinkProfile> out = probeLinks(store, t, ctxs, deadline);
  if (!out.isOk()) ctxs.abandon(t, out.status());
  return out;
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

Result<double> cpuShareOfRankZero(Store& store, int size, const Deadline& deadline) {
  const std::string mine = hostName();
  int ranks = 0;
  for (int r = 0; r < size; ++r) {
    NANOCCL_ASSIGN_OR_RETURN(std::string host,
                             store.get("tune/host/" + std::to_string(r), deadline));
    ranks += host == mine ? 1 : 0;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::min(1.0, static_cast<double>(cores) / std::max(ranks, 1));
}

}  // namespace nanoccl::tuning_probe
