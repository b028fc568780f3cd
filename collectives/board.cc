// The board rows: small calls in one round on the node's shared memory (transport.h: Board).
//
// A 4-byte allreduce by messages takes log2(size) exchanges, each a ring message through the
// matching engine and a rendezvous with one peer; with more ranks than cores (4 ranks on the
// project's 2-core machine) each rendezvous waits for its peer to be scheduled, and the call
// took 120 us. On the board every rank writes its buffer once and reads everyone's: one
// rendezvous for the whole call, driven by the calling thread (a one-round allreduce of
// 4 bytes between 4 processes on those 2 cores measured ~2 us outside nanoccl).
//
// Every rank reduces all the buffers itself, in rank order, so all ranks end with the same
// bits. Where the transport has no board (NANOCCL_INTRA_TRANSPORT=tcp, a node whose shm could
// not be set up) every rank of the node runs the next row's algorithm: they decide alike.
#include <cstring>

#include "collectives/algorithm.h"
#include "common/reduce.h"

namespace nanoccl::detail {
namespace {

bool fits(const Context& ctx, size_t bytes) {
  return ctx.board() != nullptr && bytes <= ctx.board()->capacity();
}

Status sizeMismatch(const Context& ctx, int peer, size_t theirs, size_t ours) {
  return mismatchError("rank " + std::to_string(ctx.rank()) + " expects " +
                       std::to_string(ours) + " bytes of " + ctx.fingerprint().describe() +
                       " from rank " + std::to_string(peer) + ", which published " +
                       std::to_string(theirs));
}

}  // namespace

Status allreduceBoard(Context& ctx, const CallArgs& args) {
  const size_t bytes = args.count * args.elemSize();
  if (!fits(ctx, bytes)) return allreduceRecursiveDoubling(ctx, args);
  if (args.count == 0) return Status::ok();
  char* buf = static_cast<char*>(args.recv);
  NANOCCL_CHECK(premultiplied(ctx, args, buf, args.count, buf).status());
  std::vector<const char*> views;
  std::vector<size_t> sizes;
  NANOCCL_CHECK(ctx.boardExchange(buf, bytes, views, sizes));
  for (int r = 0; r < ctx.size(); ++r) {
    if (sizes[r] != bytes) return sizeMismatch(ctx, r, sizes[r], bytes);
  }
  // ((v0 + v1) + v2) + ...: the same operands in the same order on every rank.
  const ReduceOp op = kernelOp(args.redop);
  NANOCCL_CHECK(reduceTo(buf, views[0], views[1], args.count, args.dtype, op));
  for (int r = 2; r < ctx.size(); ++r) {
    NANOCCL_CHECK(reduceTo(buf, buf, views[r], args.count, args.dtype, op));
  }
  if (args.redop == ReduceOp::kAvg) {
    NANOCCL_CHECK(divideInPlace(buf, args.count, args.dtype, ctx.size()));
  }
  return Status::ok();
}

Status broadcastBoard(Context& ctx, const CallArgs& args) {
  const size_t bytes = args.count * args.elemSize();
  if (!fits(ctx, bytes)) return broadcastTree(ctx, args);
  if (args.count == 0) return Status::ok();
  char* buf = static_cast<char*>(args.recv);
  const bool root = ctx.rank() == args.root;
  std::vector<const char*> views;
  std::vector<size_t> sizes;
  // Everyone publishes (the others nothing): the round also tells the root that all agree.
  NANOCCL_CHECK(ctx.boardExchange(buf, root ? bytes : 0, views, sizes));
  if (sizes[args.root] != bytes) return sizeMismatch(ctx, args.root, sizes[args.root], bytes);
  if (!root) std::memcpy(buf, views[args.root], bytes);
  return Status::ok();
}

Status barrierBoard(Context& ctx, const CallArgs& args) {
  if (ctx.board() == nullptr) return barrierDissemination(ctx, args);
  std::vector<const char*> views;
  std::vector<size_t> sizes;
  return ctx.boardExchange(nullptr, 0, views, sizes);
}

}  // namespace nanoccl::detail
