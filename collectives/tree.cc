// Binomial trees rooted anywhere: the latency-optimal building blocks (log2(size) rounds) of
// the small-message algorithms. Ranks are renumbered relative to the root ("vrank").
//
// Every tree edge is confirmed by an empty message in the other direction with the same tag
// (see confirmations in algorithm.h): the cost is one extra small message per edge, off the
// data's critical path.
#include <cstring>

#include "collectives/algorithm.h"
#include "common/reduce.h"

namespace nanoccl::detail {
namespace {

uint32_t log2Of(int mask) {
  uint32_t k = 0;
  while ((1 << k) < mask) ++k;
  return k;
}

}  // namespace

Status treeReduce(Context& ctx, const char* input, char* out, size_t count, DataType dtype,
                  ReduceOp op, int root, uint32_t tagBase) {
  const int n = ctx.size();
  const int vr = (ctx.rank() - root + n) % n;
  const size_t bytes = count * dataTypeSize(dtype);
  auto real = [&](int v) { return (v + root) % n; };

  // Children are vr + 2^k for every k below vr's lowest set bit; post all their receives at
  // once (they arrive whenever those subtrees finish), then reduce in a fixed order.
  std::vector<Pending> children;
  std::vector<int> childRanks;
  std::vector<uint32_t> childTags;
  std::vector<char*> staging;
  int parentMask = 0;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      parentMask = mask;
      break;
    }
    if (vr + mask < n) {
      staging.push_back(ctx.scratch(bytes));
      childRanks.push_back(real(vr + mask));
      childTags.push_back(tagBase + log2Of(mask));
      children.push_back(ctx.irecv(childRanks.back(), childTags.back(), staging.back(), bytes));
    }
  }

  const char* cur = input;
  // The root accumulates in `out`; everyone else in scratch, so their buffers stay untouched.
  char* acc = ctx.rank() == root ? out : nullptr;
  std::vector<Pending> acks;
  for (size_t i = 0; i < children.size(); ++i) {
    NANOCCL_CHECK(ctx.wait(children[i]));
    acks.push_back(ctx.isend(childRanks[i], childTags[i], kAckByte, 0));
    if (acc == nullptr) acc = ctx.scratch(bytes);
    // Lower vranks first: a fixed order of operands whatever the arrival order.
    NANOCCL_CHECK(reduceTo(acc, cur, staging[i], count, dtype, op));
    cur = acc;
  }
  if (parentMask != 0) {
    const int parent = real(vr - parentMask);
    const uint32_t tag = tagBase + log2Of(parentMask);
    Pending ack = ctx.irecv(parent, tag, ackSink(), 0);
    NANOCCL_CHECK(ctx.wait(ctx.isend(parent, tag, cur, bytes)));
    NANOCCL_CHECK(ctx.wait(ack));
  } else if (cur != out && bytes > 0) {
    std::memcpy(out, cur, bytes);  // a root without children
  }
  return ctx.waitAll(acks);
}

Status treeBroadcast(Context& ctx, char* buf, size_t bytes, int root, uint32_t tagBase) {
  const int n = ctx.size();
  const int vr = (ctx.rank() - root + n) % n;
  auto real = [&](int v) { return (v + root) % n; };
  std::vector<Pending> sends;
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      const int parent = real(vr - mask);
      const uint32_t tag = tagBase + log2Of(mask);
      NANOCCL_CHECK(ctx.wait(ctx.irecv(parent, tag, buf, bytes)));
      sends.push_back(ctx.isend(parent, tag, kAckByte, 0));
      break;
    }
    mask <<= 1;
  }
  // Largest subtree first: it has the most rounds still to go.
  std::vector<Pending> acks;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) {
      const uint32_t tag = tagBase + log2Of(mask);
      acks.push_back(ctx.irecv(real(vr + mask), tag, ackSink(), 0));
      sends.push_back(ctx.isend(real(vr + mask), tag, buf, bytes));
    }
  }
  NANOCCL_CHECK(ctx.waitAll(sends));
  return ctx.waitAll(acks);
}

}  // namespace nanoccl::detail
