#include "collectives/cost_model.h"

#include <algorithm>
#include <cmath>
#include <string_view>

namespace nanoccl::detail {
namespace {

// The hierarchical allreduce's pipeline blocks (hierarchical.cc's constants).
constexpr double kBlockBytes = 4.0 * (1 << 20);
constexpr int kMaxBlocks = 16;
constexpr double kCompressedBlockBytes = 1.0 * (1 << 20);
constexpr int kMaxCompressedBlocks = 64;

struct Link {
  double alpha = 0;  // seconds
  double bw = 1;     // bytes per second
};

// What the profile says of the node links when `crossing` ranks of a node cross at once, over
// `lanes` connections a peer (OpFingerprint::lanes; 0: all): the node's rate shared by those
// ranks, at most one pair's. One connection: the node's rate the one-socket probe measured.
Link interLink(const LinkProfile& p, int lanes, int crossing) {
  const double nodeMBps =
      lanes == 1 && p.inter.oneSocketMBps > 0 ? p.inter.oneSocketMBps : p.inter.nodeMBps;
  const double node = nodeMBps * 1e6 / std::max(crossing, 1);
  return {p.inter.alphaUs * 1e-6, std::min(p.inter.pairMBps * 1e6, node)};
}

Link intraLink(const LinkProfile& p) { return {p.intra.alphaUs * 1e-6, p.intra.pairMBps * 1e6}; }

// What `seconds` of one core's work take on a rank's share of a core.
double onShare(const LinkProfile& p, double seconds) {
  return seconds / std::max(p.cpuShare, 0.01);
}

// One CPU's seconds for `bytes` at `mbps` (MB/s of one core), given the share of a core.
double cpu(const LinkProfile& p, double bytes, double mbps) {
  return onShare(p, bytes / (std::max(mbps, 1.0) * 1e6));
}

// One ring pass over `ranks` ranks (a reduce-scatter or an allgather), each rank sending
// segments of `segment` bytes in chunks: in each of the ranks - 1 steps every link carries one
// segment, so a link carries (ranks - 1) x chunks messages one after another. Chunks pipeline
// the steps (a chunk goes on as soon as it has arrived); they do not shrink what a link
// carries. (Counted (ranks - 2 + chunks) chunk times before, a chain's time: 2.4-2.7x under
// the flat ring's measured 16-256 MB allreduces on the emulated 2x2 cluster, so that the
// planner took the ring over the hierarchy there, results/tuning/grid_2x2_1gbit.json.)
double ringPass(int ranks, double segment, double chunkBytes, Link l) {
  if (ranks < 2 || segment <= 0) return 0;
  const double chunks = std::max(1.0, std::ceil(segment / chunkBytes));
  return (ranks - 1) * chunks * (l.alpha + segment / chunks / l.bw);
}

// A chain from a root through `ranks` ranks passing `bytes` in chunks (a ring broadcast):
// every link carries the buffer once and the chunks follow each other down the chain, so
// (ranks - 2 + chunks) chunk times.
double chainPass(int ranks, double bytes, double chunkBytes, Link l) {
  if (ranks < 2 || bytes <= 0) return 0;
  const double chunks = std::max(1.0, std::ceil(bytes / chunkBytes));
  return (ranks - 2 + chunks) * (l.alpha + bytes / chunks / l.bw);
}

// Stages that overlap over `blocks` blocks (each stage time for the whole call): the slowest
// stage sets the pace, the others add their time for one block (fill and drain).
double pipelined(std::initializer_list<double> stages, int blocks) {
  double sum = 0;
  double slowest = 0;
  for (double s : stages) {
    sum += s;
    slowest = std::max(slowest, s);
  }
  return slowest + (sum - slowest) / blocks;
}

int blocksOf(double bytes, double blockBytes, int maxBlocks) {
  return static_cast<int>(std::clamp(std::floor(bytes / blockBytes), 1.0,
                                     static_cast<double>(maxBlocks)));
}

const CodecRates* ratesOf(const LinkProfile& p, const codec::Codec& c) {
  for (const CodecRates& r : p.codecs) {
    if (r.name == c.name) return &r;
  }
  return nullptr;
}

// A compressed exchange of `x` float32 bytes per rank over `nodes` ranks on `link`
// (compressed.cc: encode, send every segment to its owner, accumulate, encode the sum once,
// send it to all, decode), run as `rounds` exchanges one after another (the hierarchy's
// blocks; 1 for the flat rows), each segment cut in chunks of `chunk` float32 bytes.
// `allgather`: the allreduce (the sums go back to everyone); else the reduce-scatter.
// `chains`: the ranks of a node that run such exchanges side by side on the node's link.
//   wire and codec   overlap over the chunks of all rounds (hierarchical.cc sends round r + 1
//                    before it waits for round r's sums)
//   messages         each chunk to each peer pays the link's alpha, once per pass (as a ring
//                    pass's chunks do: a fixed cost per message, not only a latency), on the
//                    wire and on the CPU: a message's system calls and hand-offs between
//                    threads are work that shares the codec's cores. The profile has no rate
//                    for that; alpha (half a ping-pong's round trip, on a busy machine mostly
//                    that work) stands for it. Without it the model had no cost for more chunks
//                    where the CPU sets the pace: on the emulated 2x2 cluster at 10 Gbit/s
//                    (4 ranks on 2 cores) it priced 256 KiB chunks 0.3% faster than 1 MiB for
//                    a 256 MB int8 allreduce, and they ran 4-13% slower
//                    (results/tuning/grid_2x2_10gbit_{fresh,final}.txt).
//   the turn         an owner sends the sums of a round's last chunk only once that chunk has
//                    arrived and been accumulated and encoded, and round r + 1 starts after
//                    that: the latency and the work that the round's other chunks do not cover
//                    on the wire, once per round (the node's chains take turns on the link)
// So more chunks hide more of the turn and pay more messages: that trade picks the chunk.
double compressedExchange(const LinkProfile& p, const CallArgs& args, double x, int nodes,
                          Link link, bool allgather, int rounds, double chunk, int chains) {
  const codec::Codec& c = *args.codec;
  const CodecRates* r = ratesOf(p, c);
  if (r == nullptr || nodes < 2 || x <= 0) return r == nullptr ? kNoPrediction : 0;
  const size_t count = std::max<size_t>(1, static_cast<size_t>(x / 4));
  const double ratio =
      static_cast<double>(c.encodedBytes(count, args.codecParams)) / (4.0 * static_cast<double>(count));
  const double share = static_cast<double>(nodes - 1) / nodes;
  const double passes = allgather ? 2 : 1;
  const double segment = x / rounds / nodes;  // float32 bytes of one owner's segment a round
  const double chunks = std::max(1.0, std::ceil(segment / std::max(chunk, 4.0)));
  const double messages = passes * (nodes - 1) * rounds * chunks * link.alpha;
  const double wire = passes * share * x * ratio / link.bw + messages;
  double codecTime = cpu(p, x, r->encodeMBps) + cpu(p, share * x, r->accumulateMBps);
  if (allgather) codecTime += cpu(p, x / nodes, r->encodeMBps) + cpu(p, x, r->decodeMBps);
  codecTime += onShare(p, messages);
  double turn = 0;
  if (allgather) {
    // Per round: the last chunk's latency and the owner's work on it, less what the round's
    // other chunks still have on the wire meanwhile.
    const double last = segment / chunks;
    const double work = link.alpha + (nodes - 1) * cpu(p, last, r->accumulateMBps) +
                        cpu(p, last, r->encodeMBps);
    const double covered = (chunks - 1) * (nodes - 1) * last * ratio / link.bw;
    turn = rounds * std::max(0.0, work - covered) / std::max(chains, 1);
  }
  return pipelined({wire, codecTime}, static_cast<int>(std::min(rounds * chunks, 1e6))) + turn;
}

// ---- allreduce ----------------------------------------------------------------------------

double ringAllreduce(const CallArgs& args, const Topology& t, const LinkProfile& p, double chunk) {
  const int n = t.size();
  const double s = static_cast<double>(args.count) * args.elemSize();
  const Link l = t.numNodes() > 1 ? interLink(p, args.lanes, 1) : intraLink(p);
  const double seg = s / n;
  return 2 * ringPass(n, seg, chunk, l) + cpu(p, (n - 1) * seg, p.reduceMBps);
}

// The link between rank 0 and rank `d` (the partner of round d), and how many ranks of a node
// cross nodes in that round.
Link partnerLink(const CallArgs& args, const Topology& t, const LinkProfile& p, int d) {
  if (t.sameNode(0, d)) return intraLink(p);
  return interLink(p, args.lanes, t.maxLocalSize());
}

double recursiveDoubling(const CallArgs& args, const Topology& t, const LinkProfile& p) {
  const int n = t.size();
  const double s = static_cast<double>(args.count) * args.elemSize();
  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  double total = 0;
  for (int d = 1; d < pow2; d *= 2) {
    const Link l = partnerLink(args, t, p, d);
    total += l.alpha + s / l.bw + cpu(p, s, p.reduceMBps);
  }
  if (pow2 != n) {  // the extra ranks fold in and get the result back
    const Link l = t.numNodes() > 1 ? interLink(p, args.lanes, 1) : intraLink(p);
    total += 2 * (l.alpha + s / l.bw) + cpu(p, s, p.reduceMBps);
  }
  return total;
}

double treeAllreduce(const CallArgs& args, const Topology& t, const LinkProfile& p) {
  const double s = static_cast<double>(args.count) * args.elemSize();
  const double depth = std::ceil(std::log2(std::max(t.size(), 2)));
  const Link l = t.numNodes() > 1 ? interLink(p, args.lanes, 1) : intraLink(p);
  return 2 * depth * (l.alpha + s / l.bw) + depth * cpu(p, s, p.reduceMBps);
}

double hierarchicalAllreduce(const CallArgs& args, const Topology& t, const LinkProfile& p,
                             double chunk, double codecChunk) {
  const double s = static_cast<double>(args.count) * args.elemSize();
  const int shards = t.minLocalSize();
  const int local = t.maxLocalSize();
  const int nodes = t.numNodes();
  const Link in = intraLink(p);
  const Link across = interLink(p, args.lanes, shards);
  const double shard = s / shards;
  const double intraRs = ringPass(local, shard, chunk, in) + cpu(p, (local - 1) * shard, p.reduceMBps);
  const double intraAg = ringPass(local, shard, chunk, in);
  if (args.codec == nullptr) {
    const int blocks = blocksOf(s, kBlockBytes, kMaxBlocks);
    const double seg = shard / nodes;
    const double inter = 2 * ringPass(nodes, seg, chunk, across) +
                         cpu(p, (nodes - 1) * seg, p.reduceMBps);
    return pipelined({intraRs, inter, intraAg}, blocks);
  }
  const int blocks = blocksOf(s, kCompressedBlockBytes, kMaxCompressedBlocks);
  const double wide = static_cast<double>(args.count) * 4 / shards;  // float32 across nodes
  double inter = compressedExchange(p, args, wide, nodes, across, true, blocks, codecChunk, shards);
  if (args.dtype != DataType::kFloat32) inter += cpu(p, 2 * wide, p.reduceMBps);  // widen, narrow
  return pipelined({intraRs, inter, intraAg}, blocks);
}

double compressedAllreduce(const CallArgs& args, const Topology& t, const LinkProfile& p,
                           double codecChunk) {
  const double x = static_cast<double>(args.count) * 4;
  double total = compressedExchange(p, args, x, t.size(), interLink(p, args.lanes, 1), true, 1, codecChunk, 1);
  if (args.dtype != DataType::kFloat32) total += cpu(p, 2 * x, p.reduceMBps);
  return total;
}

// ---- reduce_scatter -----------------------------------------------------------------------

double totalBytes(const CallArgs& args) {
  double n = 0;
  for (size_t c : args.counts) n += static_cast<double>(c);
  return n * args.elemSize();
}

double ringReduceScatter(const CallArgs& args, const Topology& t, const LinkProfile& p,
                         double chunk) {
  const int n = t.size();
  const double seg = totalBytes(args) / n;
  const Link l = t.numNodes() > 1 ? interLink(p, args.lanes, 1) : intraLink(p);
  return ringPass(n, seg, chunk, l) + cpu(p, (n - 1) * seg, p.reduceMBps);
}

double hierarchicalReduceScatter(const CallArgs& args, const Topology& t, const LinkProfile& p,
                                 double chunk, double codecChunk) {
  const double s = totalBytes(args);
  const int shards = t.minLocalSize();
  const int local = t.maxLocalSize();
  const int nodes = t.numNodes();
  const Link in = intraLink(p);
  const double shard = s / shards;
  const double intraRs = ringPass(local, shard, chunk, in) + cpu(p, (local - 1) * shard, p.reduceMBps);
  const double out = in.alpha + s / t.size() / in.bw;
  double inter;
  if (args.codec == nullptr) {
    const double seg = shard / nodes;
    inter = ringPass(nodes, seg, chunk, interLink(p, args.lanes, shards)) +
            cpu(p, (nodes - 1) * seg, p.reduceMBps);
  } else {
    const double wide = s / args.elemSize() * 4 / shards;
    inter = compressedExchange(p, args, wide, nodes, interLink(p, args.lanes, shards), false, 1, codecChunk,
                               shards);
  }
  return intraRs + inter + out;
}

double compressedReduceScatter(const CallArgs& args, const Topology& t, const LinkProfile& p,
                               double codecChunk) {
  const double x = totalBytes(args) / args.elemSize() * 4;
  return compressedExchange(p, args, x, t.size(), interLink(p, args.lanes, 1), false, 1, codecChunk, 1);
}

// ---- allgather, broadcast (not used by the planner: see cost_model.h) --------------------

// The flat rows' link: across nodes when there are several (one rank a node crosses at once).
Link flatLink(const CallArgs& args, const Topology& t, const LinkProfile& p) {
  return t.numNodes() > 1 ? interLink(p, args.lanes, 1) : intraLink(p);
}

double ringAllgather(const CallArgs& args, const Topology& t, const LinkProfile& p, double chunk) {
  return ringPass(t.size(), totalBytes(args) / t.size(), chunk, flatLink(args, t, p));
}

double hierarchicalAllgather(const CallArgs& args, const Topology& t, const LinkProfile& p,
                             double chunk) {
  // With equal pieces a node's pieces already are its shards: the first stage moves nothing.
  const double s = totalBytes(args);
  const int shards = t.minLocalSize();
  const int nodes = t.numNodes();
  const double across =
      ringPass(nodes, s / nodes / shards, chunk, interLink(p, args.lanes, shards));
  return across + ringPass(t.maxLocalSize(), s / t.maxLocalSize(), chunk, intraLink(p));
}

double treeBroadcast(const CallArgs& args, const Topology& t, const LinkProfile& p) {
  const double s = static_cast<double>(args.count) * args.elemSize();
  const double depth = std::ceil(std::log2(std::max(t.size(), 2)));
  const Link l = flatLink(args, t, p);
  return depth * (l.alpha + s / l.bw);
}

double ringBroadcast(const CallArgs& args, const Topology& t, const LinkProfile& p, double chunk) {
  const double s = static_cast<double>(args.count) * args.elemSize();
  return chainPass(t.size(), s, chunk, flatLink(args, t, p));
}

double hierarchicalBroadcast(const CallArgs& args, const Topology& t, const LinkProfile& p,
                             double chunk) {
  const double s = static_cast<double>(args.count) * args.elemSize();
  const int shards = t.minLocalSize();
  const Link in = intraLink(p);
  const double handOut = in.alpha + s / in.bw * (shards - 1) / shards;
  const double across =
      chainPass(t.numNodes(), s / shards, chunk, interLink(p, args.lanes, shards));
  const double gather = ringPass(t.maxLocalSize(), s / t.maxLocalSize(), chunk, in);
  return handOut + across + gather;
}

// Whether the profile has every link class the topology's calls cross.
bool covers(const LinkProfile& p, const Topology& t) {
  return (t.numNodes() < 2 || p.inter.present) && (t.maxLocalSize() < 2 || p.intra.present);
}

// One round on one node's board: a message's latency, every peer's buffer read, and reduced.
double boardAllreduce(const CallArgs& args, const Topology& t, const LinkProfile& p) {
  if (t.numNodes() > 1) return kNoPrediction;
  const int n = t.size();
  const double s = static_cast<double>(args.count) * args.elemSize();
  const Link l = intraLink(p);
  return l.alpha + (n - 1) * (s / l.bw + cpu(p, s, p.reduceMBps));
}

// ---- device rows (collectives/device/rows.cc) ---------------------------------------------

// The staged allreduce's chunk of the cross stage (rows.cc's kChunkBytes).
constexpr double kDeviceChunkBytes = 4.0 * (1 << 20);

// A staging copy of `bytes` at the device's rate.
double stagingCopy(const CallArgs& args, double bytes) {
  return bytes / (std::max(args.device->copyMBps(), 1.0) * 1e6);
}

// The node stage's links: the device's own (NCCL on the GPUs' bus) or the node's transport.
Link nodeStageLink(const CallArgs& args, const LinkProfile& p) {
  const double mbps = args.device->nodeMBps();
  return mbps > 0 ? Link{p.intra.alphaUs * 1e-6, mbps * 1e6} : intraLink(p);
}

// A node stage's reduction: on the device itself where it has its own links (NCCL's kernels,
// not priced), else the host's.
double nodeStageReduce(const CallArgs& args, const LinkProfile& p, double bytes) {
  return args.device->nodeMBps() > 0 ? 0 : cpu(p, bytes, p.reduceMBps);
}

// One node stage of `op` over `ranks` ranks of `bytes` in all (per rank for a reduction's
// segment: bytes / ranks).
double nodeStage(OpType op, const CallArgs& args, const LinkProfile& p, int ranks, double bytes,
                 double chunk) {
  if (ranks < 2) return 0;
  const Link l = nodeStageLink(args, p);
  const double seg = bytes / ranks;
  switch (op) {
    case OpType::kAllreduce:
      return 2 * ringPass(ranks, seg, chunk, l) + nodeStageReduce(args, p, (ranks - 1) * seg);
    case OpType::kReduceScatter:
      return ringPass(ranks, seg, chunk, l) + nodeStageReduce(args, p, (ranks - 1) * seg);
    case OpType::kAllgather:
      return ringPass(ranks, seg, chunk, l);
    case OpType::kBroadcast:
      return chainPass(ranks, bytes, chunk, l);
    default:
      return kNoPrediction;
  }
}

// The host path's fastest row for a whole-buffer host stage (what the staged rows run on the
// staged copy).
double hostStage(const CallArgs& args, const Topology& t, const LinkProfile& p, double chunk) {
  double best = kNoPrediction;
  auto consider = [&](double x) { best = std::min(best, x); };
  if (args.op == OpType::kBroadcast) {
    consider(treeBroadcast(args, t, p));
    consider(ringBroadcast(args, t, p, chunk));
    if (t.hierarchical()) consider(hierarchicalBroadcast(args, t, p, chunk));
  } else if (args.op == OpType::kAllgather) {
    consider(ringAllgather(args, t, p, chunk));
    if (t.hierarchical()) consider(hierarchicalAllgather(args, t, p, chunk));
  } else if (args.op == OpType::kReduceScatter) {
    consider(ringReduceScatter(args, t, p, chunk));
    if (t.hierarchical()) consider(hierarchicalReduceScatter(args, t, p, chunk, chunk));
  }
  return best;
}

// device_node: one node stage. device_staged: the allreduce's node reduce-scatter, its shards'
// chunks down, across nodes and back up overlapping, the node allgather; the other ops' whole
// buffer down, the host path's row, back up.
double deviceRow(const AlgorithmRow& row, const CallArgs& args, const Topology& t,
                 const LinkProfile& p, double chunk, double codecChunk) {
  if (!args.device) return kNoPrediction;
  const double es = args.elemSize();
  const double total = args.counts.empty() ? static_cast<double>(args.count) * es : totalBytes(args);
  if (std::string_view(row.name) == "device_node") {
    return nodeStage(row.op, args, p, t.size(), total, chunk);
  }
  const double piece = static_cast<double>(args.count) * es;
  switch (row.op) {
    case OpType::kAllreduce: {
      const int shards = t.minLocalSize();
      const int nodes = t.numNodes();
      const double shard = total / shards;
      const double seg = shard / nodes;
      const Link link = interLink(p, args.lanes, shards);
      const int chunks = static_cast<int>(std::max(1.0, std::ceil(shard / kDeviceChunkBytes)));
      double across = 2 * ringPass(nodes, seg, chunk, link) + cpu(p, (nodes - 1) * seg, p.reduceMBps);
      if (args.codec != nullptr) {  // each chunk one compressed exchange, in float32
        const double wide = shard / es * 4;
        across = compressedExchange(p, args, wide, nodes, link, true, chunks, codecChunk, shards);
        if (args.dtype != DataType::kFloat32) across += cpu(p, 2 * wide, p.reduceMBps);
      }
      const double copy = stagingCopy(args, shard);
      const double inNode = nodeStage(OpType::kReduceScatter, args, p, t.maxLocalSize(), total, chunk) +
                            nodeStage(OpType::kAllgather, args, p, t.maxLocalSize(), total, chunk);
      return inNode + pipelined({copy, across, copy}, chunks);
    }
    case OpType::kBroadcast:
      return 2 * stagingCopy(args, total) + hostStage(args, t, p, chunk);
    case OpType::kAllgather:
    case OpType::kReduceScatter:
      return stagingCopy(args, total + piece) + hostStage(args, t, p, chunk);
    default:
      return kNoPrediction;
  }
}

}  // namespace

double predictMovementSeconds(const AlgorithmRow& row, const CallArgs& args, const Topology& t,
                              const LinkProfile& p, size_t chunkBytes) {
  if (t.size() < 2) return 0;
  if (!covers(p, t)) return kNoPrediction;
  const std::string_view name = row.name;
  const double chunk = static_cast<double>(std::max<size_t>(chunkBytes, 1));
  if (row.op == OpType::kAllgather) {
    if (name == "ring") return ringAllgather(args, t, p, chunk);
    if (name == "hierarchical") return hierarchicalAllgather(args, t, p, chunk);
  } else if (row.op == OpType::kBroadcast) {
    if (name == "tree") return treeBroadcast(args, t, p);
    if (name == "ring") return ringBroadcast(args, t, p, chunk);
    if (name == "hierarchical") return hierarchicalBroadcast(args, t, p, chunk);
  }
  return kNoPrediction;
}

double predictSendSeconds(double bytes, bool interNode, int crossing, const LinkProfile& p) {
  if (interNode && !p.inter.present) return kNoPrediction;
  if (!interNode && !p.intra.present) return kNoPrediction;
  const Link l = interNode ? interLink(p, 0, crossing) : intraLink(p);
  return l.alpha + std::max(bytes, 0.0) / l.bw;
}

double predictSeconds(const AlgorithmRow& row, const CallArgs& args, const Topology& t,
                      const LinkProfile& p, size_t chunkBytes) {
  if (t.size() < 2) return 0;
  if (!covers(p, t)) return kNoPrediction;
  const std::string_view name = row.name;
  const double chunk = static_cast<double>(std::max<size_t>(chunkBytes, 1));
  const double codecChunk =
      args.codecChunkBytes != 0 ? static_cast<double>(args.codecChunkBytes) : chunk;
  if (args.codec != nullptr && !row.lossy) return kNoPrediction;
  if (row.device) return deviceRow(row, args, t, p, chunk, codecChunk);
  if (row.op == OpType::kAllreduce) {
    if (name == "ring") return ringAllreduce(args, t, p, chunk);
    if (name == "recursive_doubling") return recursiveDoubling(args, t, p);
    if (name == "board") return boardAllreduce(args, t, p);
    if (name == "tree") return treeAllreduce(args, t, p);
    if (name == "hierarchical") return hierarchicalAllreduce(args, t, p, chunk, codecChunk);
    if (name == "compressed" && args.codec != nullptr) {
      return compressedAllreduce(args, t, p, codecChunk);
    }
  } else if (row.op == OpType::kReduceScatter) {
    if (name == "ring") return ringReduceScatter(args, t, p, chunk);
    if (name == "hierarchical") return hierarchicalReduceScatter(args, t, p, chunk, codecChunk);
    if (name == "compressed" && args.codec != nullptr) {
      return compressedReduceScatter(args, t, p, codecChunk);
    }
  }
  return kNoPrediction;
}

}  // namespace nanoccl::detail
