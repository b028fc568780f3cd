// Hierarchical collectives: an intra-node stage, an inter-node stage and an intra-node stage
// again, so that each byte crosses the slow node links once per node instead of once per rank,
// and every local rank drives its own share of the node's inter-node traffic at the same time.
//
// Threads and groups (see SubGroup, Hierarchy in algorithm.h)
//   The local and cross groups are not communicators with queues and workers of their own:
//   each stage below runs the flat building blocks (ring reduce-scatter, ring allgather, ...)
//   synchronously inside the parent's call, through a child Context whose peers are the
//   group's members on the parent's transport (the routed transport carries the local group's
//   messages over shared memory and the cross group's over the network). Nothing is queued on
//   any communicator, so no stage can wait for work that sits behind the call running it; a
//   failed stage fails the call, and the worker then aborts the transports before the scratch
//   memory goes away. The messages carry the parent call's fingerprint (its sequence number
//   included), so a disagreement is still reported as a mismatch; the two groups' peers are
//   disjoint, so their tags never meet. Errors are prefixed with the stage and the parent
//   ranks of the group.
//   The large allreduce pipelines its stages over blocks (see kPipelineBlockBytes): the
//   thread running the call reduces and gathers in the node while the hierarchy's StageHelper
//   thread (started by the first such call, kept by the communicator) crosses nodes; each stage
//   has its own tag range per block. The other collectives run their stages one after another.
//
// Shards and uneven nodes
//   Data is cut into S = min over nodes of the local size shards; local rank s < S of every
//   node carries shard s across nodes in its cross group (whose rank is the node index), and
//   local ranks >= S hold empty shards. With equal nodes that is the textbook plan (L shards,
//   every local rank on the node links at once). With uneven nodes (2+1) or one-rank nodes it
//   degenerates gracefully towards the leader-based plan (S = 1: reduce to local rank 0,
//   leaders exchange, local broadcast, where the "reduce" and "broadcast" are the ring
//   reduce-scatter and allgather with one non-empty segment: pipelined chains). Either way
//   the inter-node bytes per node are the optimum, 2(m-1)/m x size for an allreduce over m
//   nodes; what uneven nodes lose is only the parallelism of the extra local ranks.
//
// Compression (args.codec): only the cross stage is lossy (compressed.cc); the intra-node
// stages move the input type losslessly, so each byte is encoded once per node, not once per
// rank. A float16/bfloat16 call's shards are widened to float32 for the cross stage only (the
// codec encodes and the peers' contributions accumulate in float32) and rounded back once.
//
// Reductions: kPremulSum scales this rank's input once, at the start; kAvg divides the final
// sum by the world size once, where the reduced shard first exists. The stages reduce as kSum.
// Results are identical on every rank (each shard is reduced in one fixed order by one group
// and then copied), and equal the flat algorithms' up to floating-point reordering.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <memory>
#include <thread>

#include "collectives/algorithm.h"
#include "common/completion.h"
#include "common/reduce.h"
#include "common/thread_name.h"

namespace nanoccl::detail {
namespace {

// float16/bfloat16: under a codec, what crosses nodes is widened to float32.
bool isHalfPrecision(DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; }

// A run of elements [start, start + count) of some node's block.
struct Range {
  size_t start = 0;
  size_t count = 0;
};

Range intersect(Range a, Range b) {
  const size_t lo = std::max(a.start, b.start);
  const size_t hi = std::min(a.start + a.count, b.start + b.count);
  return hi > lo ? Range{lo, hi - lo} : Range{lo, 0};
}

Status inStage(const SubGroup& group, const Status& s) {
  return s.isOk() ? s : s.withContext(group.name + ": ");
}

// Segments (pointers) of `counts` laid out back to back from `base`.
std::vector<char*> segmentsOf(char* base, const std::vector<size_t>& counts, size_t es) {
  std::vector<char*> out(counts.size());
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    out[i] = base + at * es;
    at += counts[i];
  }
  return out;
}

size_t maxOf(const std::vector<size_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// The pieces of an allgather / reduce_scatter (counts[r] elements per rank, in rank order in
// the caller's buffers), seen per node: node k's block is the pieces of its ranks back to back
// in local-rank order, cut into S shards (evenSplit). The staging buffer holds shard 0 of every
// block (node order), then shard 1 of every block, ...: so what local rank s handles in the
// intra-node stage is one contiguous region, and node k's shard s one contiguous run in it.
struct ShardLayout {
  std::vector<size_t> rankStart;                // [rank]: offset in the caller's buffer
  std::vector<std::vector<size_t>> pieceStart;  // [node][local rank]: offset in the block
  std::vector<std::vector<size_t>> shardStart;  // [node][shard]: offset in the block
  std::vector<std::vector<size_t>> shardCount;  // [node][shard]
  std::vector<size_t> regionStart;              // [shard]: offset in staging
  std::vector<size_t> regionCount;              // [shard]
  std::vector<std::vector<size_t>> staged;      // [shard][node]: offset in staging

  ShardLayout(const Topology& topo, const std::vector<size_t>& counts, int shards) {
    const int m = topo.numNodes();
    rankStart = prefixOffsets(counts);
    pieceStart.resize(m);
    shardStart.resize(m);
    shardCount.resize(m);
    for (int k = 0; k < m; ++k) {
      size_t block = 0;
      for (int q : topo.nodeRanks[k]) {
        pieceStart[k].push_back(block);
        block += counts[q];
      }
      shardCount[k] = evenSplit(block, shards);
      shardStart[k] = prefixOffsets(shardCount[k]);
    }
    regionStart.resize(shards);
    regionCount.resize(shards);
    staged.assign(shards, std::vector<size_t>(m));
    size_t at = 0;
    for (int s = 0; s < shards; ++s) {
      regionStart[s] = at;
      for (int k = 0; k < m; ++k) {
        staged[s][k] = at;
        at += shardCount[k][s];
      }
      regionCount[s] = at - regionStart[s];
    }
  }

  // Copies every shard between the caller's rank-ordered buffer and staging.
  void copy(const Topology& topo, const std::vector<size_t>& counts, size_t es,
            const char* rankOrdered, char* staging) const {
    move(topo, counts, es, const_cast<char*>(rankOrdered), staging, true);
  }
  void uncopy(const Topology& topo, const std::vector<size_t>& counts, size_t es,
              const char* staging, char* rankOrdered) const {
    move(topo, counts, es, rankOrdered, const_cast<char*>(staging), false);
  }

 private:
  void move(const Topology& topo, const std::vector<size_t>& counts, size_t es, char* ranked,
            char* staging, bool toStaging) const {
    for (int k = 0; k < topo.numNodes(); ++k) {
      for (size_t s = 0; s < regionStart.size(); ++s) {
        const Range shard{shardStart[k][s], shardCount[k][s]};
        for (size_t j = 0; j < topo.nodeRanks[k].size(); ++j) {
          const int q = topo.nodeRanks[k][j];
          const Range ov = intersect(shard, Range{pieceStart[k][j], counts[q]});
          if (ov.count == 0) continue;
          char* a = ranked + (rankStart[q] + ov.start - pieceStart[k][j]) * es;
          char* b = staging + (staged[s][k] + ov.start - shard.start) * es;
          if (toStaging) {
            std::memcpy(b, a, ov.count * es);
          } else {
            std::memcpy(a, b, ov.count * es);
          }
        }
      }
    }
  }
};

// Within the node: local rank i holds the block run have[i] (at `mine`, this rank's own) and
// wants want[i] (into `into`); every overlap moves directly between the two local ranks.
// Both sides compute the same overlaps, so empty ones are skipped on both.
Status exchangeRuns(Context& local, const std::vector<Range>& have, const char* mine,
                    const std::vector<Range>& want, char* into, size_t es, uint32_t tag) {
  const int me = local.rank();
  std::vector<Pending> ps;
  for (int i = 0; i < local.size(); ++i) {
    if (i == me) continue;
    const Range in = intersect(have[i], want[me]);
    if (in.count > 0) {
      ps.push_back(local.irecv(i, tag, into + (in.start - want[me].start) * es, in.count * es));
    }
  }
  for (int i = 0; i < local.size(); ++i) {
    if (i == me) continue;
    const Range out = intersect(have[me], want[i]);
    if (out.count > 0) {
      ps.push_back(local.isend(i, tag, mine + (out.start - have[me].start) * es, out.count * es));
    }
  }
  const Range self = intersect(have[me], want[me]);
  if (self.count > 0) {
    std::memmove(into + (self.start - want[me].start) * es,
                 mine + (self.start - have[me].start) * es, self.count * es);
  }
  return local.waitAll(ps);
}

// Large allreduces run their three stages as a pipeline over blocks of about this size: while
// block b crosses the node links, block b + 1 is reduced and block b - 1 gathered inside the
// node, so the intra-node stages hide behind the inter-node one (the slow one) instead of
// adding to it. Few blocks keep the per-block latency (ring steps) small against the data.
constexpr size_t kPipelineBlockBytes = size_t{4} << 20;
constexpr int kMaxPipelineBlocks = 16;
// Compressed, the inter-node stage moves a quarter (int8) or less of the bytes, so the pipeline's
// fill and drain (the first block's reduction and the last block's gather inside the node, which
// nothing overlaps) weigh more: smaller blocks, more of them.
constexpr size_t kCompressedPipelineBlockBytes = size_t{1} << 20;
constexpr int kMaxCompressedPipelineBlocks = 64;

}  // namespace

StageHelper::~StageHelper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StageHelper::run(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  job_ = std::move(job);
  if (!thread_.joinable()) {
    thread_ = namedThread("stage", [this] {
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        cv_.wait(lock, [&] { return stop_ || job_ != nullptr; });
        if (job_ == nullptr) return;  // stopping, and nothing left to run
        std::function<void()> next = std::move(job_);
        job_ = nullptr;
        lock.unlock();
        next();
        lock.lock();
      }
    });
  }
  cv_.notify_all();
}

// The flat allreduce the cross groups run on their shard: latency-optimal for small shards,
// the ring otherwise (both give every member the same bits).
Status crossAllreduce(Context& cross, const CallArgs& shard) {
  if (shard.planBytes() <= cross.config().smallMessageBytes) {
    return allreduceRecursiveDoubling(cross, shard);
  }
  return allreduceRing(cross, shard);
}

// The ring allreduce of `count` elements at `buf` over `ctx`, with tags from `tagBase` (the
// table's allreduceRing always starts at tag 0; the blocks of one call need their own tags).
Status ringAllreduceAt(Context& ctx, char* buf, size_t count, DataType dtype, ReduceOp op,
                       size_t chunkElems, uint32_t tagBase) {
  const size_t es = dataTypeSize(dtype);
  const std::vector<size_t> counts = evenSplit(count, ctx.size());
  const std::vector<char*> seg = segmentsOf(buf, counts, es);
  const std::vector<const char*> src(seg.begin(), seg.end());
  NANOCCL_CHECK(ringReduceScatter(ctx, counts, src, seg, dtype, op, chunkElems, tagBase));
  return ringAllgather(ctx, counts, seg, es, chunkElems,
                       tagBase + ringTags(ctx, counts, chunkElems));
}

Status allreduceHierarchical(Context& ctx, const CallArgs& args) {
  if (args.count == 0) return Status::ok();
  const Hierarchy& h = *ctx.hierarchy();
  const size_t es = args.elemSize();
  const ReduceOp op = kernelOp(args.redop);
  char* buf = static_cast<char*>(args.recv);
  NANOCCL_CHECK(premultiplied(ctx, args, buf, args.count, buf).status());

  // Blocks of the buffer, each cut into shards: shard s of a block is reduced over the node
  // into local rank s, then across nodes by local rank s of every node; local ranks >= S
  // hold empty shards.
  const int lr = h.local.rank;
  const bool lossy = args.codec != nullptr;
  const int blocks = static_cast<int>(std::clamp<size_t>(
      args.count * es / (lossy ? kCompressedPipelineBlockBytes : kPipelineBlockBytes), 1,
      static_cast<size_t>(lossy ? kMaxCompressedPipelineBlocks : kMaxPipelineBlocks)));
  const std::vector<size_t> blockCounts = evenSplit(args.count, blocks);
  const std::vector<size_t> blockStarts = prefixOffsets(blockCounts);
  std::vector<std::vector<size_t>> counts(blocks);
  std::vector<std::vector<char*>> seg(blocks);
  for (int b = 0; b < blocks; ++b) {
    counts[b] = evenSplit(blockCounts[b], h.shards);
    counts[b].resize(h.local.size, 0);
    seg[b] = segmentsOf(buf + blockStarts[b] * es, counts[b], es);
  }

  // Chunking and tag ranges from the largest block (the first), the same on every member of
  // each group: block b uses [2b, 2b + 2) x the tags of one ring pass, on either group.
  Context local(ctx, h.local);
  Context cross(ctx, h.cross);
  size_t localChunk = 1, crossChunk = 1;
  uint32_t localTags = 0, crossTags = 0;
  if (h.local.size > 1) {
    localChunk = chunkElements(local, es, counts[0][0], 2 * blocks);
    localTags = ringTags(local, counts[0], localChunk);
  }
  if (lr < h.shards && args.codec != nullptr) {
    crossTags = CompressedAllreduce::tags(cross, *args.codec, args.codecParams, counts[0][lr]);
  } else if (lr < h.shards) {
    const std::vector<size_t> shardSplit = evenSplit(counts[0][lr], h.cross.size);
    crossChunk = chunkElements(cross, es, shardSplit[0], 2 * blocks);
    crossTags = ringTags(cross, shardSplit, crossChunk);
  }

  auto reduceInNode = [&](int b) -> Status {
    if (h.local.size == 1) return Status::ok();
    const std::vector<const char*> src(seg[b].begin(), seg[b].end());
    return inStage(h.local, ringReduceScatter(local, counts[b], src, seg[b], args.dtype, op,
                                              localChunk, 2 * b * localTags));
  };
  // float16/bfloat16 under a codec: the node stages stay in the input type (lossless, as
  // uncompressed calls), and only this rank's shard of each block crosses nodes in float32: a
  // widened copy (wide[b]) that the codec encodes and the peers' contributions accumulate into,
  // rounded back once by finishShard().
  const bool half = lossy && isHalfPrecision(args.dtype);
  std::vector<float*> wide(blocks, nullptr);
  auto widenShard = [&](int b) -> Status {
    if (!half) return Status::ok();
    wide[b] = reinterpret_cast<float*>(ctx.scratch(counts[b][lr] * sizeof(float)));
    return widenToFloat32(wide[b], seg[b][lr], counts[b][lr], args.dtype);
  };
  // Block b's shard across nodes under the codec (lossy across nodes only: the shard was
  // reduced losslessly inside the node), not started yet; widenShard(b) first.
  auto compressedBlock = [&](int b) {
    float* residual = args.residual ? args.residual + (seg[b][lr] - buf) / es : nullptr;
    float* data = half ? wide[b] : reinterpret_cast<float*>(seg[b][lr]);
    return std::make_unique<CompressedAllreduce>(cross, *args.codec, args.codecParams, data,
                                                 counts[b][lr], residual, b * crossTags);
  };
  // Where block b's reduced shard first exists: kAvg's one division, and the one rounding
  // back of a widened shard (divided in float32 first).
  auto finishShard = [&](int b) -> Status {
    const bool avg = args.redop == ReduceOp::kAvg;
    if (half) {
      if (avg) NANOCCL_CHECK(divideInPlace(wide[b], counts[b][lr], DataType::kFloat32, ctx.size()));
      return narrowFromFloat32(seg[b][lr], wide[b], counts[b][lr], args.dtype);
    }
    if (!avg) return Status::ok();
    return divideInPlace(seg[b][lr], counts[b][lr], args.dtype, ctx.size());
  };
  auto reduceAcrossNodes = [&](int b) -> Status {
    if (lr >= h.shards) return Status::ok();
    if (args.codec != nullptr) {
      NANOCCL_CHECK(widenShard(b));
      NANOCCL_CHECK(inStage(h.cross, compressedBlock(b)->run()));
    } else if (blocks == 1) {
      CallArgs shard = args;
      shard.redop = op;  // the scaling is done here, once
      shard.send = shard.recv = seg[b][lr];
      shard.count = counts[b][lr];
      NANOCCL_CHECK(inStage(h.cross, crossAllreduce(cross, shard)));
    } else {
      NANOCCL_CHECK(inStage(h.cross, ringAllreduceAt(cross, seg[b][lr], counts[b][lr], args.dtype,
                                                     op, crossChunk, 2 * b * crossTags)));
    }
    return finishShard(b);
  };
  auto gatherInNode = [&](int b) -> Status {
    if (h.local.size == 1) return Status::ok();
    return inStage(
        h.local, ringAllgather(local, counts[b], seg[b], es, localChunk, (2 * b + 1) * localTags));
  };

  if (blocks == 1) {
    NANOCCL_CHECK(reduceInNode(0));
    NANOCCL_CHECK(reduceAcrossNodes(0));
    return gatherInNode(0);
  }

  // The pipeline. This thread runs the node stages in one order on every local rank (ring
  // stages of one group must not be taken in different orders: each would wait for the other),
  // reducing kAhead blocks before it gathers: reduce 0 .. kAhead, gather 0, reduce kAhead + 1,
  // gather 1, ... The cross-node stage runs on the hierarchy's helper thread, block by block as
  // they are reduced, so the node links stay busy while this thread works in the node. Block
  // b's stages say they are done through reduced[b] and crossed[b]; the first failure
  // completes them all with it and aborts the transports (the call has failed; the worker
  // would abort them next anyway), which ends every other stage's waits at once.
  constexpr int kAhead = 2;
  const bool helped = lr < h.shards;  // local ranks >= shards cross nothing
  std::vector<Completion> reduced(blocks), crossed(blocks);
  std::mutex failMu;
  Status failure;
  auto fail = [&](const Status& s) {
    {
      std::lock_guard<std::mutex> lock(failMu);
      if (!failure.isOk()) return;
      failure = s;
    }
    // Both groups ride the same transport unless the cross group has a rail of its own.
    if (h.local.transport != nullptr) h.local.transport->abort(s);
    if (h.cross.transport != nullptr && h.cross.transport != h.local.transport) {
      h.cross.transport->abort(s);
    }
    for (int b = 0; b < blocks; ++b) {
      reduced[b].complete(s);
      crossed[b].complete(s);
    }
  };
  auto await = [&](const Completion& c) -> Status {
    if (c.wait(ctx.deadline())) return c.status();
    return timeoutError("timed out waiting for the previous pipeline stage");
  };
  // The compressed cross stage overlaps consecutive blocks: block b's encoded segments go out
  // before block b - 1's allgather is waited for, so the node links never wait for a round
  // trip between blocks (one block's exchange is small next to the link's bandwidth-delay).
  auto compressedCross = [&]() -> Status {
    std::unique_ptr<CompressedAllreduce> prev;
    int prevBlock = -1;
    auto finishPrev = [&]() -> Status {
      if (!prev) return Status::ok();
      NANOCCL_CHECK(inStage(h.cross, prev->finish()));
      NANOCCL_CHECK(finishShard(prevBlock));
      prev.reset();
      crossed[prevBlock].complete(Status::ok());
      return Status::ok();
    };
    for (int b = 0; b < blocks; ++b) {
      if (!reduced[b].done()) NANOCCL_CHECK(finishPrev());  // nothing to start yet
      NANOCCL_CHECK(await(reduced[b]));
      NANOCCL_CHECK(widenShard(b));
      std::unique_ptr<CompressedAllreduce> cur = compressedBlock(b);
      NANOCCL_CHECK(inStage(h.cross, cur->start()));
      NANOCCL_CHECK(finishPrev());
      NANOCCL_CHECK(inStage(h.cross, cur->reduce()));
      prev = std::move(cur);
      prevBlock = b;
    }
    return finishPrev();
  };
  auto crossStage = [&]() -> Status {
    if (args.codec != nullptr) return compressedCross();
    for (int b = 0; b < blocks; ++b) {
      NANOCCL_CHECK(await(reduced[b]));
      NANOCCL_CHECK(reduceAcrossNodes(b));
      crossed[b].complete(Status::ok());
    }
    return Status::ok();
  };
  // Shared with the job: complete() may still be running on the helper when this thread's
  // wait returns and leaves.
  auto crossEnded = std::make_shared<Completion>();
  if (helped) {
    h.helper->run([&, crossEnded] {
      const Status s = crossStage();
      if (!s.isOk()) fail(s);
      crossEnded->complete(s);
    });
  }
  for (int b = 0; b < blocks + kAhead; ++b) {
    Status s;
    if (b < blocks) {
      s = reduceInNode(b);
      if (s.isOk()) reduced[b].complete(Status::ok());
      if (s.isOk() && !helped) crossed[b].complete(Status::ok());
    }
    if (const int g = b - kAhead; s.isOk() && g >= 0) {
      s = await(crossed[g]);
      if (s.isOk()) s = gatherInNode(g);
    }
    if (!s.isOk()) {
      fail(s);
      break;
    }
  }
  if (helped) crossEnded->wait(Deadline::never());  // its job uses this frame
  std::lock_guard<std::mutex> lock(failMu);
  return failure;
}

Status reduceScatterHierarchical(Context& ctx, const CallArgs& args) {
  const size_t total = std::accumulate(args.counts.begin(), args.counts.end(), size_t{0});
  if (total == 0) return Status::ok();
  const Hierarchy& h = *ctx.hierarchy();
  const Topology& topo = h.topology;
  const size_t es = args.elemSize();
  const ReduceOp op = kernelOp(args.redop);
  const int node = topo.nodeOf[ctx.rank()];
  const int lr = h.local.rank;
  const int S = h.shards;
  const ShardLayout lay(topo, args.counts, S);

  // The input is const and laid out by rank: stage a copy by shard, scaled once.
  char* z = ctx.scratch(total * es);
  lay.copy(topo, args.counts, es, static_cast<const char*>(args.send), z);
  if (args.redop == ReduceOp::kPremulSum) {
    NANOCCL_CHECK(scaleInPlace(z, total, args.dtype, args.premulFactor));
  }

  // 1. Over the node: local rank s gets the node's sum of shard s of every node's block.
  Context local(ctx, h.local);
  uint32_t exchangeTag = 0;
  if (h.local.size > 1) {
    std::vector<size_t> counts(h.local.size, 0);
    std::copy(lay.regionCount.begin(), lay.regionCount.end(), counts.begin());
    const std::vector<char*> acc = segmentsOf(z, counts, es);
    const std::vector<const char*> src(acc.begin(), acc.end());
    const size_t ce = chunkElements(local, es, maxOf(counts), 1);
    NANOCCL_CHECK(
        inStage(h.local, ringReduceScatter(local, counts, src, acc, args.dtype, op, ce, 0)));
    exchangeTag = ringTags(local, counts, ce);
  }
  // 2. Across nodes: local rank s of node k gets the total of shard s of node k's block.
  if (lr < S) {
    Context cross(ctx, h.cross);
    const int m = topo.numNodes();
    std::vector<size_t> counts(m);
    std::vector<char*> acc(m);
    for (int k = 0; k < m; ++k) {
      counts[k] = lay.shardCount[k][lr];
      acc[k] = z + lay.staged[lr][k] * es;
    }
    if (args.codec != nullptr) {
      // float16/bfloat16: the shards cross nodes in float32 (see allreduceHierarchical).
      const bool half = isHalfPrecision(args.dtype);
      std::vector<float*> shards(m);
      for (int k = 0; k < m; ++k) {
        shards[k] = reinterpret_cast<float*>(acc[k]);
        if (half) {
          shards[k] = reinterpret_cast<float*>(ctx.scratch(counts[k] * sizeof(float)));
          NANOCCL_CHECK(widenToFloat32(shards[k], acc[k], counts[k], args.dtype));
        }
      }
      // Error feedback: the residual is laid out like the staged copy z (this rank encodes its
      // node's partial sums of shard lr, at lay.staged[lr][k]); the same layout every call of
      // these counts on this topology.
      std::vector<float*> residual;
      for (int k = 0; args.residual != nullptr && k < m; ++k) {
        residual.push_back(args.residual + lay.staged[lr][k]);
      }
      NANOCCL_CHECK(inStage(h.cross, compressedReduceScatter(cross, *args.codec, args.codecParams,
                                                             counts, shards, 0, residual)));
      if (half) {
        NANOCCL_CHECK(narrowFromFloat32(acc[node], shards[node], counts[node], args.dtype));
      }
    } else {
      const std::vector<const char*> src(acc.begin(), acc.end());
      const size_t ce = chunkElements(cross, es, maxOf(counts), 1);
      NANOCCL_CHECK(
          inStage(h.cross, ringReduceScatter(cross, counts, src, acc, args.dtype, op, ce, 0)));
    }
  }
  // 3. Within the node: each rank collects its piece from the shards that overlap it.
  std::vector<Range> have(h.local.size), want(h.local.size);
  for (int i = 0; i < h.local.size; ++i) {
    want[i] = {lay.pieceStart[node][i], args.counts[topo.nodeRanks[node][i]]};
    if (i < S) have[i] = {lay.shardStart[node][i], lay.shardCount[node][i]};
  }
  const char* mine = lr < S ? z + lay.staged[lr][node] * es : z;
  NANOCCL_CHECK(inStage(h.local, exchangeRuns(local, have, mine, want,
                                              static_cast<char*>(args.recv), es, exchangeTag)));
  if (args.redop == ReduceOp::kAvg) {
    NANOCCL_CHECK(divideInPlace(args.recv, args.counts[ctx.rank()], args.dtype, ctx.size()));
  }
  return Status::ok();
}

Status allgatherHierarchical(Context& ctx, const CallArgs& args) {
  const size_t total = std::accumulate(args.counts.begin(), args.counts.end(), size_t{0});
  if (total == 0) return Status::ok();
  const Hierarchy& h = *ctx.hierarchy();
  const Topology& topo = h.topology;
  const size_t es = args.elemSize();
  const int node = topo.nodeOf[ctx.rank()];
  const int lr = h.local.rank;
  const int S = h.shards;
  const ShardLayout lay(topo, args.counts, S);
  char* z = ctx.scratch(total * es);

  // 1. Within the node: local rank s collects shard s of this node's block from the pieces.
  Context local(ctx, h.local);
  std::vector<Range> have(h.local.size), want(h.local.size);
  for (int i = 0; i < h.local.size; ++i) {
    have[i] = {lay.pieceStart[node][i], args.counts[topo.nodeRanks[node][i]]};
    if (i < S) want[i] = {lay.shardStart[node][i], lay.shardCount[node][i]};
  }
  char* myShard = lr < S ? z + lay.staged[lr][node] * es : z;
  NANOCCL_CHECK(inStage(h.local, exchangeRuns(local, have, static_cast<const char*>(args.send),
                                              want, myShard, es, 0)));
  // 2. Across nodes: local rank s gets shard s of every node's block.
  if (lr < S) {
    Context cross(ctx, h.cross);
    const int m = topo.numNodes();
    std::vector<size_t> counts(m);
    std::vector<char*> bufs(m);
    for (int k = 0; k < m; ++k) {
      counts[k] = lay.shardCount[k][lr];
      bufs[k] = z + lay.staged[lr][k] * es;
    }
    const size_t ce = chunkElements(cross, es, maxOf(counts), 1);
    NANOCCL_CHECK(inStage(h.cross, ringAllgather(cross, counts, bufs, es, ce, 0)));
  }
  // 3. Over the node: every local rank gets every shard.
  if (h.local.size > 1) {
    std::vector<size_t> counts(h.local.size, 0);
    std::copy(lay.regionCount.begin(), lay.regionCount.end(), counts.begin());
    const size_t ce = chunkElements(local, es, maxOf(counts), 1);
    NANOCCL_CHECK(
        inStage(h.local, ringAllgather(local, counts, segmentsOf(z, counts, es), es, ce, 1)));
  }
  lay.uncopy(topo, args.counts, es, z, static_cast<char*>(args.recv));
  return Status::ok();
}

Status broadcastHierarchical(Context& ctx, const CallArgs& args) {
  if (args.count == 0) return Status::ok();
  const Hierarchy& h = *ctx.hierarchy();
  const Topology& topo = h.topology;
  const size_t es = args.elemSize();
  const int lr = h.local.rank;
  const int rootNode = topo.nodeOf[args.root];
  const int rootLocal = topo.localRankOf[args.root];
  char* buf = static_cast<char*>(args.recv);
  std::vector<size_t> counts = evenSplit(args.count, h.shards);
  counts.resize(h.local.size, 0);
  const std::vector<char*> seg = segmentsOf(buf, counts, es);

  // 1. On the root's node: the root hands shard s to local rank s. Every receiver confirms
  //    (algorithm.h), so ranks that disagree about the root meet a mismatch, not silence.
  Context local(ctx, h.local);
  if (topo.nodeOf[ctx.rank()] == rootNode && h.local.size > 1) {
    if (lr == rootLocal) {
      std::vector<Pending> ps;
      for (int s = 0; s < h.shards; ++s) {
        if (s == lr) continue;
        ps.push_back(local.irecv(s, 0, ackSink(), 0));
        ps.push_back(local.isend(s, 0, seg[s], counts[s] * es));
      }
      NANOCCL_CHECK(inStage(h.local, local.waitAll(ps)));
    } else if (lr < h.shards) {
      NANOCCL_CHECK(
          inStage(h.local, local.wait(local.irecv(rootLocal, 0, seg[lr], counts[lr] * es))));
      NANOCCL_CHECK(inStage(h.local, local.wait(local.isend(rootLocal, 0, kAckByte, 0))));
    }
  }
  // 2. Across nodes: local rank s of the root's node broadcasts shard s to local rank s of
  //    every other node.
  if (lr < h.shards) {
    Context cross(ctx, h.cross);
    CallArgs shard = args;
    shard.send = shard.recv = seg[lr];
    shard.count = counts[lr];
    shard.root = rootNode;
    NANOCCL_CHECK(inStage(h.cross, broadcastRing(cross, shard)));
  }
  // 3. Over every node: every local rank gets every shard.
  if (h.local.size > 1) {
    const size_t ce = chunkElements(local, es, counts[0], 1);
    NANOCCL_CHECK(inStage(h.local, ringAllgather(local, counts, seg, es, ce, 1)));
  }
  return Status::ok();
}

}  // namespace nanoccl::detail
