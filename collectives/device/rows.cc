// The device rows of the algorithm table (algorithm.h: "device_node", "device_staged") and
// the host's wait on a device fence. A device call's buffers are memory the host does not
// touch; every operation on them goes through the Device (device.h): copies and node stages
// are queued on the device, the inter-node legs run on the host over the communicator's
// transport (its hierarchy's groups ride it: no connection of their own), on staging memory
// the copies fill.
//
// Stages of a call use disjoint tag ranges in each group: the node stages
// Device::kNodeStageTags apart in the node's, the chunks of the cross stage their own ranges in
// the cross group's (the two groups' peers are disjoint).
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>

#include "collectives/algorithm.h"
#include "collectives/device/device.h"
#include "collectives/planner.h"
#include "common/reduce.h"

namespace nanoccl {

Status waitFence(Device& device, const Fence& fence, const Deadline& deadline, const char* what) {
  int pauseUs = 2;
  for (;;) {
    Result<bool> passed = device.passed(fence);
    if (!passed.isOk()) return passed.status().withContext(device.describe() + ": ");
    if (passed.value()) return Status::ok();
    if (deadline.expired()) {
      return timeoutError(std::string(what) + " did not complete on the " + device.describe() +
                          " before the call's deadline");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pauseUs));
    pauseUs = std::min(pauseUs * 2, 200);
  }
}

namespace detail {
namespace {

// The staging unit of the cross stage: large enough that a chunk's network allreduce dwarfs its
// fixed costs, small enough that the copies of the neighbouring chunks hide behind it. Two
// staging slots of it (0 and 1); slot 2 holds the whole-buffer stagings.
constexpr size_t kChunkBytes = size_t{4} << 20;
constexpr int kChunkSlots = 2;
constexpr int kBulkSlot = 2;

// A device call's node and cross groups, as the topology gives them.
struct Stages {
  std::unique_ptr<Context> localOwned, crossOwned;
  Context* node = nullptr;   // null: this rank's node has one rank
  Context* cross = nullptr;  // null: this rank carries no shard across nodes
  int shards = 1;            // local ranks that carry a shard (the smallest node's size)
  int local = 0;             // this rank's local rank
  int localSize = 1;
};

// On several nodes: the hierarchy's groups, or (one rank a node) the call's own as the cross.
Stages stagesOf(Context& ctx) {
  Stages s;
  const Hierarchy* h = ctx.hierarchy();
  if (h == nullptr) {
    s.cross = &ctx;
    return s;
  }
  s.shards = h->shards;
  s.local = h->local.rank;
  s.localSize = h->local.size;
  if (h->local.size > 1) {
    s.localOwned = std::make_unique<Context>(ctx, h->local);
    s.node = s.localOwned.get();
  }
  if (h->local.rank < h->shards) {
    s.crossOwned = std::make_unique<Context>(ctx, h->cross);
    s.cross = s.crossOwned.get();
  }
  return s;
}

// The topology of the call's ranks, for planning a host stage of the whole group.
Topology topologyOf(const Context& ctx) {
  if (const Hierarchy* h = ctx.hierarchy()) return h->topology;
  std::vector<std::string> ids;  // no hierarchy on several nodes: one rank a node
  for (int r = 0; r < ctx.size(); ++r) ids.push_back(std::to_string(r));
  return Topology::fromNodeIds(std::move(ids));
}

Status inGroup(const char* stage, const Status& s) {
  return s.isOk() ? s : s.withContext(std::string(stage) + ": ");
}

// Host staging memory of `bytes` in the bulk slot, once the device has run everything queued so
// far (an earlier call's copy may still read the slot).
Result<char*> bulk(Device& dev, size_t bytes, const Deadline& deadline) {
  NANOCCL_ASSIGN_OR_RETURN(std::shared_ptr<Fence> idle, dev.record());
  NANOCCL_CHECK(waitFence(dev, *idle, deadline, "the previous staging copies"));
  return dev.staging(kBulkSlot, bytes);
}

// Queues a copy to the host and waits until it has landed.
Status download(Device& dev, char* host, const void* src, size_t bytes, const Deadline& d) {
  NANOCCL_CHECK(dev.copy(host, src, bytes));
  NANOCCL_ASSIGN_OR_RETURN(std::shared_ptr<Fence> landed, dev.record());
  return waitFence(dev, *landed, d, "the copy to the host");
}

// Runs `args` (host memory now) on the host path's row for it, over the whole group.
Status hostStage(Context& ctx, CallArgs args) {
  args.device = nullptr;
  args.after = nullptr;
  Config config = ctx.config();
  config.algo = "auto";  // a forced name applies to the call's own row
  NANOCCL_ASSIGN_OR_RETURN(const AlgorithmRow* row,
                           planAlgorithm(args, topologyOf(ctx), config));
  return row->run(ctx, args);
}

// Moves `n` elements (`es` bytes each) at `dev` through the two chunk slots: for each chunk the
// copy to the host (download), `hostOp` on the host copy, the copy back (upload). The copies
// run on the device queue ahead of the host: while hostOp works on chunk c, chunk c + 1 is
// already coming down and chunk c - 1 going up. A slot is written by the host for chunk c + 2
// only after the fence recorded behind chunk c's copy back (queue order).
Status throughHost(Device& dev, char* devPtr, size_t n, size_t es, bool down, bool up,
                   const std::function<Status(char* host, size_t len, size_t chunk)>& hostOp,
                   const Deadline& d) {
  if (n == 0) return Status::ok();
  const size_t per = std::max<size_t>(1, kChunkBytes / es);
  const size_t chunks = (n + per - 1) / per;
  char* slot[kChunkSlots];
  for (int b = 0; b < kChunkSlots; ++b) {
    NANOCCL_ASSIGN_OR_RETURN(slot[b], dev.staging(b, kChunkBytes));
  }
  std::shared_ptr<Fence> ready[kChunkSlots];
  auto ahead = [&](size_t c) -> Status {
    const size_t b = c % kChunkSlots;
    const size_t first = c * per;
    if (down) NANOCCL_CHECK(dev.copy(slot[b], devPtr + first * es, std::min(per, n - first) * es));
    NANOCCL_ASSIGN_OR_RETURN(ready[b], dev.record());
    return Status::ok();
  };
  for (size_t c = 0; c < std::min<size_t>(chunks, kChunkSlots); ++c) NANOCCL_CHECK(ahead(c));
  for (size_t c = 0; c < chunks; ++c) {
    const size_t b = c % kChunkSlots;
    const size_t first = c * per;
    const size_t len = std::min(per, n - first);
    NANOCCL_CHECK(waitFence(dev, *ready[b], d, down ? "the copy to the host" : "the copy back"));
    NANOCCL_CHECK(hostOp(slot[b], len, c));
    if (up) NANOCCL_CHECK(dev.copy(devPtr + first * es, slot[b], len * es));
    if (c + kChunkSlots < chunks) NANOCCL_CHECK(ahead(c + kChunkSlots));
  }
  return Status::ok();
}

// The node stage of `args` with `op`, in place on `recv`.
CallArgs nodeCall(const CallArgs& args, OpType op, ReduceOp redop, char* recv, size_t count,
                  int root) {
  CallArgs c;
  c.op = op;
  c.dtype = args.dtype;
  c.redop = redop;
  c.premulFactor = args.premulFactor;
  c.root = root;
  c.send = recv;
  c.recv = recv;
  c.count = count;
  return c;
}

// A call on one node: one node stage. allreduce and broadcast are in place on recv.
Status onNode(Context& ctx, const CallArgs& args) {
  Device& dev = *args.device;
  const bool inPlaceOp = args.op == OpType::kAllreduce || args.op == OpType::kBroadcast;
  const bool sends = args.op == OpType::kAllreduce || ctx.rank() == args.root;
  if (inPlaceOp && sends && args.send != nullptr && args.send != args.recv) {
    NANOCCL_CHECK(dev.copy(args.recv, args.send, args.count * args.elemSize()));
  }
  return dev.nodeStage(ctx, args, 0);
}

}  // namespace

Status allreduceDeviceNode(Context& ctx, const CallArgs& args) { return onNode(ctx, args); }
Status broadcastDeviceNode(Context& ctx, const CallArgs& args) { return onNode(ctx, args); }
Status allgatherDeviceNode(Context& ctx, const CallArgs& args) { return onNode(ctx, args); }
Status reduceScatterDeviceNode(Context& ctx, const CallArgs& args) { return onNode(ctx, args); }

// Several nodes: shards reduced in the node (node stage), each carried across nodes by its
// local rank through the chunk slots, gathered in the node (node stage). As the host path's
// hierarchical allreduce: S = the smallest node's size shards, local ranks >= S carry none;
// kPremulSum scales each input once, in the first stage that reduces it; kAvg divides once,
// by the group's size, on the host. Under a codec (args.codec) each chunk crosses nodes
// compressed (CompressedAllreduce, float16/bfloat16 widened to float32 on the host for it):
// lossy across nodes only, every rank ending with the same bits.
Status allreduceDeviceStaged(Context& ctx, const CallArgs& args) {
  Device& dev = *args.device;
  const size_t es = args.elemSize();
  const size_t n = args.count;
  char* buf = static_cast<char*>(args.recv);
  if (n == 0) return Status::ok();
  if (args.send != nullptr && args.send != args.recv) NANOCCL_CHECK(dev.copy(buf, args.send, n * es));
  Stages st = stagesOf(ctx);
  const ReduceOp sum = args.redop == ReduceOp::kAvg ? ReduceOp::kSum : args.redop;
  std::vector<size_t> shard = evenSplit(n, st.shards);
  shard.resize(static_cast<size_t>(st.localSize), 0);
  const std::vector<size_t> at = prefixOffsets(shard);
  // Equal shards, one per local rank: one reduce-scatter and one allgather in place; else a
  // reduce to and a broadcast from each shard's local rank.
  const bool even = st.shards == st.localSize && n % static_cast<size_t>(st.localSize) == 0;
  uint32_t nodeTags = 0;
  auto nodeStage = [&](const CallArgs& c) {
    const uint32_t base = nodeTags;
    nodeTags += Device::kNodeStageTags;
    return inGroup("node stage", dev.nodeStage(*st.node, c, base));
  };
  if (st.node != nullptr) {
    if (even) {
      CallArgs rs = nodeCall(args, OpType::kReduceScatter, sum, buf + at[st.local] * es,
                             shard[st.local], -1);
      rs.send = buf;
      rs.counts = shard;
      NANOCCL_CHECK(nodeStage(rs));
    } else {
      for (int s = 0; s < st.shards; ++s) {
        if (shard[s] == 0) continue;
        NANOCCL_CHECK(nodeStage(nodeCall(args, OpType::kReduce, sum, buf + at[s] * es, shard[s], s)));
      }
    }
  }
  if (st.cross != nullptr && shard[st.local] > 0) {
    Context& x = *st.cross;
    const size_t mine = shard[st.local];
    // kPremulSum: scaled here where no node stage reduced (and scaled) the input first.
    const bool scaleHere = args.redop == ReduceOp::kPremulSum && st.node == nullptr;
    const ReduceOp crossOp = kernelOp(args.redop);
    const size_t per = std::max<size_t>(1, kChunkBytes / es);
    const size_t chunks = (mine + per - 1) / per;
    const size_t firstChunk = std::min(per, mine);  // the largest
    const std::vector<size_t> split = evenSplit(firstChunk, x.size());
    const size_t chunkElems = chunkElements(x, es, split[0], static_cast<int>(2 * chunks));
    const uint32_t tags = ringTags(x, split, chunkElems);
    const bool lossy = args.codec != nullptr;
    const uint32_t codecTags =
        lossy ? CompressedAllreduce::tags(x, *args.codec, args.codecParams, firstChunk) : 0;
    float* wide = nullptr;  // float16/bfloat16 under a codec: a chunk widened to float32
    if (lossy && args.dtype != DataType::kFloat32) {
      wide = reinterpret_cast<float*>(x.scratch(firstChunk * sizeof(float)));
    }
    auto acrossNodes = [&](char* host, size_t len, size_t c) -> Status {
      if (scaleHere) NANOCCL_CHECK(scaleInPlace(host, len, args.dtype, args.premulFactor));
      if (lossy) {
        float* f = wide != nullptr ? wide : reinterpret_cast<float*>(host);
        if (wide != nullptr) NANOCCL_CHECK(widenToFloat32(wide, host, len, args.dtype));
        float* residual = args.residual != nullptr ? args.residual + at[st.local] + c * per : nullptr;
        NANOCCL_CHECK(inGroup("cross-node stage",
                              compressedAllreduce(x, *args.codec, args.codecParams, f, len,
                                                  residual, static_cast<uint32_t>(c) * codecTags)));
        if (wide != nullptr) NANOCCL_CHECK(narrowFromFloat32(host, wide, len, args.dtype));
      } else if (chunks == 1) {
        CallArgs one = nodeCall(args, OpType::kAllreduce, crossOp, host, len, -1);
        NANOCCL_CHECK(inGroup("cross-node stage", crossAllreduce(x, one)));
      } else {
        NANOCCL_CHECK(inGroup("cross-node stage",
                              ringAllreduceAt(x, host, len, args.dtype, crossOp, chunkElems,
                                              static_cast<uint32_t>(2 * c) * tags)));
      }
      if (args.redop != ReduceOp::kAvg) return Status::ok();
      return divideInPlace(host, len, args.dtype, ctx.size());
    };
    NANOCCL_CHECK(throughHost(dev, buf + at[st.local] * es, mine, es, true, true, acrossNodes,
                              ctx.deadline()));
  }
  if (st.node != nullptr) {
    if (even) {
      CallArgs ag = nodeCall(args, OpType::kAllgather, sum, buf, shard[st.local], -1);
      ag.send = buf + at[st.local] * es;
      ag.counts = shard;
      NANOCCL_CHECK(nodeStage(ag));
    } else {
      for (int s = 0; s < st.shards; ++s) {
        if (shard[s] == 0) continue;
        NANOCCL_CHECK(
            nodeStage(nodeCall(args, OpType::kBroadcast, sum, buf + at[s] * es, shard[s], s)));
      }
    }
  }
  return Status::ok();
}

// Several nodes: the root's bytes to the host, the host path's broadcast, back to the device on
// the other ranks.
Status broadcastDeviceStaged(Context& ctx, const CallArgs& args) {
  Device& dev = *args.device;
  const size_t bytes = args.count * args.elemSize();
  if (bytes == 0) return Status::ok();
  const bool root = ctx.rank() == args.root;
  if (root && args.send != nullptr && args.send != args.recv) {
    NANOCCL_CHECK(dev.copy(args.recv, args.send, bytes));
  }
  NANOCCL_ASSIGN_OR_RETURN(char* host, bulk(dev, bytes, ctx.deadline()));
  if (root) NANOCCL_CHECK(download(dev, host, args.recv, bytes, ctx.deadline()));
  CallArgs h = args;
  h.send = h.recv = host;
  NANOCCL_CHECK(hostStage(ctx, h));
  return root ? Status::ok() : dev.copy(args.recv, host, bytes);
}

// Several nodes: this rank's piece to the host, the host path's allgather, all back.
Status allgatherDeviceStaged(Context& ctx, const CallArgs& args) {
  Device& dev = *args.device;
  const size_t es = args.elemSize();
  const size_t total = std::accumulate(args.counts.begin(), args.counts.end(), size_t{0});
  if (total == 0) return Status::ok();
  NANOCCL_ASSIGN_OR_RETURN(char* host, bulk(dev, total * es, ctx.deadline()));
  char* mine = host + prefixOffsets(args.counts)[ctx.rank()] * es;
  NANOCCL_CHECK(download(dev, mine, args.send, args.count * es, ctx.deadline()));
  CallArgs h = args;
  h.send = mine;
  h.recv = host;
  NANOCCL_CHECK(hostStage(ctx, h));
  return dev.copy(args.recv, host, total * es);
}

// Several nodes: the whole input to the host, the host path's reduce_scatter, this rank's part
// back.
Status reduceScatterDeviceStaged(Context& ctx, const CallArgs& args) {
  Device& dev = *args.device;
  const size_t es = args.elemSize();
  const size_t total = std::accumulate(args.counts.begin(), args.counts.end(), size_t{0});
  const size_t mine = args.counts[static_cast<size_t>(ctx.rank())];
  if (total == 0) return Status::ok();
  NANOCCL_ASSIGN_OR_RETURN(char* host, bulk(dev, (total + mine) * es, ctx.deadline()));
  NANOCCL_CHECK(download(dev, host, args.send, total * es, ctx.deadline()));
  CallArgs h = args;
  h.send = host;
  h.recv = host + total * es;
  NANOCCL_CHECK(hostStage(ctx, h));
  return dev.copy(args.recv, host + total * es, mine * es);
}

Status runDeviceCall(Context& ctx, const CallArgs& args, const AlgorithmRow& row,
                     std::shared_ptr<Fence>* end) {
  Device& dev = *args.device;
  if (args.after) NANOCCL_CHECK(dev.queueWait(*args.after));
  NANOCCL_CHECK(row.run(ctx, args));
  NANOCCL_ASSIGN_OR_RETURN(*end, dev.record());
  return Status::ok();
}

}  // namespace detail
}  // namespace nanoccl
