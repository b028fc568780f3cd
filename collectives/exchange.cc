// Collectives where every rank ends with a different part: allgather, reduce_scatter,
// alltoall; and the barrier.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "collectives/algorithm.h"
#include "common/reduce.h"

namespace nanoccl::detail {

Status allgatherRing(Context& ctx, const CallArgs& args) {
  const std::vector<size_t>& counts = args.counts;
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  if (total == 0) return Status::ok();
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t es = args.elemSize();
  const std::vector<size_t> offs = prefixOffsets(counts);
  char* recv = static_cast<char*>(args.recv);
  std::vector<char*> segs(n);
  for (int i = 0; i < n; ++i) segs[i] = recv + offs[i] * es;
  if (counts[r] > 0 && segs[r] != args.send) std::memmove(segs[r], args.send, counts[r] * es);
  const size_t ce = chunkElements(ctx, es, *std::max_element(counts.begin(), counts.end()), 1);
  return ringAllgather(ctx, counts, segs, es, ce, 0);
}

Status reduceScatterRing(Context& ctx, const CallArgs& args) {
  const std::vector<size_t>& counts = args.counts;
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  if (total == 0) return Status::ok();
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t es = args.elemSize();
  // `send` is const: premultiply into a copy, and accumulate partial sums in scratch; only
  // this rank's own segment is accumulated straight into `recv`.
  NANOCCL_ASSIGN_OR_RETURN(const char* input, premultiplied(ctx, args, args.send, total, nullptr));
  char* accBase = ctx.scratch(total * es);
  const std::vector<size_t> offs = prefixOffsets(counts);
  std::vector<const char*> src(n);
  std::vector<char*> acc(n);
  for (int i = 0; i < n; ++i) {
    src[i] = input + offs[i] * es;
    acc[i] = i == r ? static_cast<char*>(args.recv) : accBase + offs[i] * es;
  }
  const size_t ce = chunkElements(ctx, es, *std::max_element(counts.begin(), counts.end()), 1);
  NANOCCL_CHECK(ringReduceScatter(ctx, counts, src, acc, args.dtype, kernelOp(args.redop), ce, 0));
  if (args.redop == ReduceOp::kAvg) {
    NANOCCL_CHECK(divideInPlace(args.recv, counts[r], args.dtype, n));
  }
  return Status::ok();
}

// Pairwise exchange: every receive is posted first (so no message waits as "unexpected"),
// then the sends go out to rank+1, rank+2, ... so that at any moment each rank is the target
// of about one sender. Empty pieces are still exchanged so size disagreements surface as
// length mismatches.
Status alltoallPairwise(Context& ctx, const CallArgs& args) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t es = args.elemSize();
  const std::vector<size_t> soffs = prefixOffsets(args.counts);
  const std::vector<size_t> roffs = prefixOffsets(args.recvCounts);
  const char* send = static_cast<const char*>(args.send);
  char* recv = static_cast<char*>(args.recv);
  std::vector<Pending> recvs;
  for (int i = 1; i < n; ++i) {
    const int p = (r - i + n) % n;
    recvs.push_back(ctx.irecv(p, 0, recv + roffs[p] * es, args.recvCounts[p] * es));
  }
  std::vector<Pending> sends;
  for (int i = 1; i < n; ++i) {
    const int p = (r + i) % n;
    sends.push_back(ctx.isend(p, 0, send + soffs[p] * es, args.counts[p] * es));
  }
  if (args.counts[r] > 0 && recv + roffs[r] * es != send + soffs[r] * es) {
    std::memmove(recv + roffs[r] * es, send + soffs[r] * es, args.counts[r] * es);
  }
  NANOCCL_CHECK(ctx.waitAll(recvs));
  return ctx.waitAll(sends);
}

// Dissemination: in round k every rank signals rank + 2^k and waits for rank - 2^k; after
// ceil(log2(size)) rounds every rank has heard, transitively, from every other.
Status barrierDissemination(Context& ctx, const CallArgs& args) {
  const int n = ctx.size();
  const int r = ctx.rank();
  static const char kToken = 1;
  char* in = ctx.scratch(32);
  uint32_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, ++round) {
    Pending rx = ctx.irecv((r - dist + n) % n, round, in + round, 1);
    Pending tx = ctx.isend((r + dist) % n, round, &kToken, 1);
    NANOCCL_CHECK(ctx.wait(rx));
    NANOCCL_CHECK(ctx.wait(tx));
  }
  return Status::ok();
}

}  // namespace nanoccl::detail
