// Ring reduce-scatter and allgather: the bandwidth-optimal building blocks of the large-message
// algorithms. Each segment is cut into chunks of ctx.chunkBytes(); a chunk is forwarded to the
// right neighbour as soon as it has been reduced (or received), so consecutive ring steps
// overlap instead of waiting for whole segments.
#include <algorithm>

#include "collectives/algorithm.h"
#include "common/reduce.h"

namespace nanoccl::detail {
namespace {

// Receives posted ahead of the one being reduced: enough to keep the link busy while this
// thread reduces, few enough that the staging memory stays a handful of chunks.
constexpr size_t kRecvWindow = 4;

struct Chunk {
  int step;
  int segment;
  size_t chunk;
  size_t offset;  // elements into the segment
  size_t count;
};

// Segment received at `step` is (rank - step - shift) mod n.
int segmentAt(int rank, int n, int k) { return ((rank - k) % n + n) % n; }

size_t chunksOf(size_t count, size_t chunkElems) { return (count + chunkElems - 1) / chunkElems; }

}  // namespace

Status ringReduceScatter(Context& ctx, const std::vector<size_t>& counts,
                         const std::vector<const char*>& src, const std::vector<char*>& acc,
                         DataType dtype, ReduceOp op, size_t chunkElems, uint32_t tagBase) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t es = dataTypeSize(dtype);
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  size_t maxChunks = 0;
  for (size_t c : counts) maxChunks = std::max(maxChunks, chunksOf(c, chunkElems));
  auto tagOf = [&](int step, size_t chunk) {
    return tagBase + static_cast<uint32_t>(static_cast<size_t>(step) * maxChunks + chunk);
  };

  // Step s sends segment (r - s - 1) and receives (r - s - 2): after n - 1 steps this rank
  // has reduced every rank's contribution to segment r.
  std::vector<Pending> sends;
  const int first = segmentAt(r, n, 1);
  for (size_t c = 0; c < chunksOf(counts[first], chunkElems); ++c) {
    const size_t off = c * chunkElems;
    const size_t len = std::min(chunkElems, counts[first] - off);
    sends.push_back(ctx.isend(right, tagOf(0, c), src[first] + off * es, len * es));
  }

  std::vector<Chunk> items;
  for (int s = 0; s < n - 1; ++s) {
    const int seg = segmentAt(r, n, s + 2);
    for (size_t c = 0; c < chunksOf(counts[seg], chunkElems); ++c) {
      const size_t off = c * chunkElems;
      items.push_back({s, seg, c, off, std::min(chunkElems, counts[seg] - off)});
    }
  }
  if (items.empty()) return ctx.waitAll(sends);

  const size_t window = std::min(items.size(), kRecvWindow);
  const size_t slotBytes = std::min(chunkElems,
                                    [&] {
                                      size_t m = 0;
                                      for (size_t c : counts) m = std::max(m, c);
                                      return m;
                                    }()) *
                           es;
  char* slots = ctx.scratch(window * slotBytes);
  std::vector<Pending> recvs(items.size());
  auto post = [&](size_t k) {
    const Chunk& it = items[k];
    recvs[k] =
        ctx.irecv(left, tagOf(it.step, it.chunk), slots + (k % window) * slotBytes, it.count * es);
  };
  for (size_t k = 0; k < window; ++k) post(k);

  for (size_t k = 0; k < items.size(); ++k) {
    const Chunk& it = items[k];
    NANOCCL_CHECK(ctx.wait(recvs[k]));
    recvs[k].req.reset();
    char* out = acc[it.segment] + it.offset * es;
    // This rank's part first, then the partial sum from the left: the order is the same for a
    // segment on every rank, so all ranks end with bit-identical results after the allgather.
    NANOCCL_CHECK(reduceTo(out, src[it.segment] + it.offset * es, slots + (k % window) * slotBytes,
                           it.count, dtype, op));
    if (it.step < n - 2)
      sends.push_back(ctx.isend(right, tagOf(it.step + 1, it.chunk), out, it.count * es));
    if (k + window < items.size()) post(k + window);
  }
  return ctx.waitAll(sends);
}

Status ringAllgather(Context& ctx, const std::vector<size_t>& counts, const std::vector<char*>& buf,
                     size_t elemSize, size_t chunkElems, uint32_t tagBase) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t es = elemSize;
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  size_t maxChunks = 0;
  for (size_t c : counts) maxChunks = std::max(maxChunks, chunksOf(c, chunkElems));
  auto tagOf = [&](int step, size_t chunk) {
    return tagBase + static_cast<uint32_t>(static_cast<size_t>(step) * maxChunks + chunk);
  };

  // Step t sends segment (r - t) and receives (r - t - 1), straight into its final place, so
  // every receive can be posted up front.
  std::vector<Chunk> items;
  for (int t = 0; t < n - 1; ++t) {
    const int seg = segmentAt(r, n, t + 1);
    for (size_t c = 0; c < chunksOf(counts[seg], chunkElems); ++c) {
      const size_t off = c * chunkElems;
      items.push_back({t, seg, c, off, std::min(chunkElems, counts[seg] - off)});
    }
  }
  std::vector<Pending> recvs;
  recvs.reserve(items.size());
  for (const Chunk& it : items) {
    recvs.push_back(
        ctx.irecv(left, tagOf(it.step, it.chunk), buf[it.segment] + it.offset * es, it.count * es));
  }
  std::vector<Pending> sends;
  for (size_t c = 0; c < chunksOf(counts[r], chunkElems); ++c) {
    const size_t off = c * chunkElems;
    const size_t len = std::min(chunkElems, counts[r] - off);
    sends.push_back(ctx.isend(right, tagOf(0, c), buf[r] + off * es, len * es));
  }
  for (size_t k = 0; k < items.size(); ++k) {
    const Chunk& it = items[k];
    NANOCCL_CHECK(ctx.wait(recvs[k]));
    if (it.step < n - 2) {
      sends.push_back(ctx.isend(right, tagOf(it.step + 1, it.chunk),
                                buf[it.segment] + it.offset * es, it.count * es));
    }
  }
  return ctx.waitAll(sends);
}

}  // namespace nanoccl::detail
