// Allreduce algorithms. All are in place on the caller's buffer, so kPremulSum scales that
// buffer directly (it is overwritten by the result anyway) and kAvg divides the final sum.
#include <algorithm>

#include "collectives/algorithm.h"
#include "common/reduce.h"

namespace nanoccl::detail {

// The reduction kernels treat kAvg and kPremulSum as kSum; passing kSum keeps that explicit.
ReduceOp kernelOp(ReduceOp op) {
  return op == ReduceOp::kAvg || op == ReduceOp::kPremulSum ? ReduceOp::kSum : op;
}

Status allreduceRing(Context& ctx, const CallArgs& args) {
  if (args.count == 0) return Status::ok();
  const int n = ctx.size();
  const size_t es = args.elemSize();
  char* buf = static_cast<char*>(args.recv);
  NANOCCL_CHECK(premultiplied(ctx, args, buf, args.count, buf).status());

  const std::vector<size_t> counts = evenSplit(args.count, n);
  const std::vector<size_t> offs = prefixOffsets(counts);
  std::vector<const char*> src(n);
  std::vector<char*> acc(n);
  for (int i = 0; i < n; ++i) src[i] = acc[i] = buf + offs[i] * es;
  const size_t ce = chunkElements(ctx, es, counts[0], 2);

  NANOCCL_CHECK(ringReduceScatter(ctx, counts, src, acc, args.dtype, kernelOp(args.redop), ce, 0));
  if (args.redop == ReduceOp::kAvg) {
    NANOCCL_CHECK(divideInPlace(acc[ctx.rank()], counts[ctx.rank()], args.dtype, n));
  }
  return ringAllgather(ctx, counts, acc, es, ce, ringTags(ctx, counts, ce));
}

// Recursive doubling over the largest power of two p <= size; the extra size - p ranks fold
// their data into a partner first and get the result back at the end (MPICH's scheme).
Status allreduceRecursiveDoubling(Context& ctx, const CallArgs& args) {
  if (args.count == 0) return Status::ok();
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = args.count * args.elemSize();
  const ReduceOp op = kernelOp(args.redop);
  char* buf = static_cast<char*>(args.recv);
  NANOCCL_CHECK(premultiplied(ctx, args, buf, args.count, buf).status());
  char* tmp = ctx.scratch(bytes);

  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  constexpr uint32_t kFoldTag = 0;
  constexpr uint32_t kUnfoldTag = 63;

  int newRank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      NANOCCL_CHECK(ctx.wait(ctx.isend(r + 1, kFoldTag, buf, bytes)));
      newRank = -1;
    } else {
      NANOCCL_CHECK(ctx.wait(ctx.irecv(r - 1, kFoldTag, tmp, bytes)));
      NANOCCL_CHECK(reduceTo(buf, tmp, buf, args.count, args.dtype, op));
      newRank = r / 2;
    }
  } else {
    newRank = r - rem;
  }

  if (newRank >= 0) {
    uint32_t round = 1;
    for (int mask = 1; mask < p; mask <<= 1, ++round) {
      const int newPeer = newRank ^ mask;
      const int peer = newPeer < rem ? newPeer * 2 + 1 : newPeer + rem;
      Pending in = ctx.irecv(peer, round, tmp, bytes);
      Pending out = ctx.isend(peer, round, buf, bytes);
      NANOCCL_CHECK(ctx.wait(in));
      NANOCCL_CHECK(ctx.wait(out));
      // The lower rank's data first, so both partners compute bit-identical results.
      if (peer < r) {
        NANOCCL_CHECK(reduceTo(buf, tmp, buf, args.count, args.dtype, op));
      } else {
        NANOCCL_CHECK(reduceTo(buf, buf, tmp, args.count, args.dtype, op));
      }
    }
    if (args.redop == ReduceOp::kAvg) {
      NANOCCL_CHECK(divideInPlace(buf, args.count, args.dtype, n));
    }
  }

  if (r < 2 * rem) {
    if (r % 2 == 1) return ctx.wait(ctx.isend(r - 1, kUnfoldTag, buf, bytes));
    return ctx.wait(ctx.irecv(r + 1, kUnfoldTag, buf, bytes));
  }
  return Status::ok();
}

Status allreduceTree(Context& ctx, const CallArgs& args) {
  if (args.count == 0) return Status::ok();
  const size_t bytes = args.count * args.elemSize();
  char* buf = static_cast<char*>(args.recv);
  NANOCCL_CHECK(premultiplied(ctx, args, buf, args.count, buf).status());
  NANOCCL_CHECK(treeReduce(ctx, buf, buf, args.count, args.dtype, kernelOp(args.redop), 0, 0));
  if (ctx.rank() == 0 && args.redop == ReduceOp::kAvg) {
    NANOCCL_CHECK(divideInPlace(buf, args.count, args.dtype, ctx.size()));
  }
  return treeBroadcast(ctx, buf, bytes, 0, 32);
}

}  // namespace nanoccl::detail
