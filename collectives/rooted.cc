// Collectives with a root: reduce, broadcast, gather, scatter.
#include <algorithm>
#include <cstring>

#include "collectives/algorithm.h"
#include "common/reduce.h"

namespace nanoccl::detail {

Status reduceTree(Context& ctx, const CallArgs& args) {
  if (args.count == 0) return Status::ok();
  const bool isRoot = ctx.rank() == args.root;
  char* buf = static_cast<char*>(args.recv);
  // The root's buffer becomes the result, so it may be scaled in place; others scale a copy.
  NANOCCL_ASSIGN_OR_RETURN(const char* input,
                           premultiplied(ctx, args, buf, args.count, isRoot ? buf : nullptr));
  NANOCCL_CHECK(
      treeReduce(ctx, input, buf, args.count, args.dtype, kernelOp(args.redop), args.root, 0));
  if (isRoot && args.redop == ReduceOp::kAvg) {
    NANOCCL_CHECK(divideInPlace(buf, args.count, args.dtype, ctx.size()));
  }
  return Status::ok();
}

// Ring reduce-scatter (every rank reduces 1/size of the data), then each rank sends its
// reduced segment to the root: ~2x the data on the wire instead of log2(size)x.
Status reduceRing(Context& ctx, const CallArgs& args) {
  if (args.count == 0) return Status::ok();
  const int n = ctx.size();
  const int r = ctx.rank();
  const bool isRoot = r == args.root;
  const size_t es = args.elemSize();
  char* buf = static_cast<char*>(args.recv);
  NANOCCL_ASSIGN_OR_RETURN(const char* input,
                           premultiplied(ctx, args, buf, args.count, isRoot ? buf : nullptr));
  char* accBase = isRoot ? buf : ctx.scratch(args.count * es);

  const std::vector<size_t> counts = evenSplit(args.count, n);
  const std::vector<size_t> offs = prefixOffsets(counts);
  std::vector<const char*> src(n);
  std::vector<char*> acc(n);
  for (int i = 0; i < n; ++i) {
    src[i] = input + offs[i] * es;
    acc[i] = accBase + offs[i] * es;
  }
  const size_t ce = chunkElements(ctx, es, counts[0], 2);
  NANOCCL_CHECK(ringReduceScatter(ctx, counts, src, acc, args.dtype, kernelOp(args.redop), ce, 0));

  const uint32_t gatherTag = ringTags(ctx, counts, ce);
  if (!isRoot) {
    if (counts[r] == 0) return Status::ok();
    return ctx.wait(ctx.isend(args.root, gatherTag, acc[r], counts[r] * es));
  }
  std::vector<Pending> recvs;
  for (int p = 0; p < n; ++p) {
    if (p != r && counts[p] > 0) recvs.push_back(ctx.irecv(p, gatherTag, acc[p], counts[p] * es));
  }
  NANOCCL_CHECK(ctx.waitAll(recvs));
  if (args.redop == ReduceOp::kAvg) {
    NANOCCL_CHECK(divideInPlace(buf, args.count, args.dtype, n));
  }
  return Status::ok();
}

Status broadcastTree(Context& ctx, const CallArgs& args) {
  if (args.count == 0) return Status::ok();
  return treeBroadcast(ctx, static_cast<char*>(args.recv), args.count * args.elemSize(), args.root,
                       0);
}

// A chain root -> root+1 -> ... in chunks: each rank forwards a chunk as soon as it lands, so
// the time is ~ bytes/bw + (size - 2) x chunk/bw rather than log2(size) x bytes/bw. Each rank
// confirms the first chunk to its predecessor (see confirmations in algorithm.h).
Status broadcastRing(Context& ctx, const CallArgs& args) {
  if (args.count == 0) return Status::ok();
  const int n = ctx.size();
  const int vr = (ctx.rank() - args.root + n) % n;
  const size_t es = args.elemSize();
  char* buf = static_cast<char*>(args.recv);
  const size_t ce = chunkElements(ctx, es, args.count, 1);
  const size_t chunks = (args.count + ce - 1) / ce;
  const int prev = (ctx.rank() - 1 + n) % n;
  const int next = (ctx.rank() + 1) % n;
  const bool forwards = vr + 1 < n;

  std::vector<Pending> recvs;
  if (vr != 0) {
    for (size_t c = 0; c < chunks; ++c) {
      const size_t len = std::min(ce, args.count - c * ce);
      recvs.push_back(ctx.irecv(prev, static_cast<uint32_t>(c), buf + c * ce * es, len * es));
    }
  }
  std::vector<Pending> sends;
  std::vector<Pending> acks;
  if (forwards) acks.push_back(ctx.irecv(next, 0, ackSink(), 0));
  for (size_t c = 0; c < chunks; ++c) {
    const size_t len = std::min(ce, args.count - c * ce);
    if (vr != 0) {
      NANOCCL_CHECK(ctx.wait(recvs[c]));
      if (c == 0) sends.push_back(ctx.isend(prev, 0, kAckByte, 0));
    }
    if (forwards) {
      sends.push_back(ctx.isend(next, static_cast<uint32_t>(c), buf + c * ce * es, len * es));
    }
  }
  NANOCCL_CHECK(ctx.waitAll(sends));
  return ctx.waitAll(acks);
}

// Direct: every rank sends its piece to the root, which confirms each piece (see
// confirmations in algorithm.h). Pieces of 0 elements are still exchanged, so a rank that
// disagrees about the sizes meets a length mismatch instead of a timeout.
Status gatherDirect(Context& ctx, const CallArgs& args) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t es = args.elemSize();
  if (r != args.root) {
    Pending ack = ctx.irecv(args.root, 0, ackSink(), 0);
    NANOCCL_CHECK(ctx.wait(ctx.isend(args.root, 0, args.send, args.count * es)));
    return ctx.wait(ack);
  }
  const std::vector<size_t> offs = prefixOffsets(args.counts);
  char* recv = static_cast<char*>(args.recv);
  std::vector<Pending> recvs;
  for (int p = 0; p < n; ++p) {
    if (p != r) recvs.push_back(ctx.irecv(p, 0, recv + offs[p] * es, args.counts[p] * es));
  }
  char* mine = recv + offs[r] * es;
  if (args.count > 0 && mine != args.send) std::memmove(mine, args.send, args.count * es);
  std::vector<Pending> acks;
  for (const Pending& p : recvs) {
    NANOCCL_CHECK(ctx.wait(p));
    acks.push_back(ctx.isend(p.peer, 0, kAckByte, 0));
  }
  return ctx.waitAll(acks);
}

// Direct: the root sends every piece; each rank confirms its piece.
Status scatterDirect(Context& ctx, const CallArgs& args) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t es = args.elemSize();
  if (r != args.root) {
    NANOCCL_CHECK(ctx.wait(ctx.irecv(args.root, 0, args.recv, args.count * es)));
    return ctx.wait(ctx.isend(args.root, 0, kAckByte, 0));
  }
  const std::vector<size_t> offs = prefixOffsets(args.counts);
  const char* send = static_cast<const char*>(args.send);
  std::vector<Pending> sends, acks;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    acks.push_back(ctx.irecv(p, 0, ackSink(), 0));
    sends.push_back(ctx.isend(p, 0, send + offs[p] * es, args.counts[p] * es));
  }
  const char* mine = send + offs[r] * es;
  if (args.count > 0 && mine != args.recv) std::memmove(args.recv, mine, args.count * es);
  NANOCCL_CHECK(ctx.waitAll(sends));
  return ctx.waitAll(acks);
}

}  // namespace nanoccl::detail
