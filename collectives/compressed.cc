// Compressed collectives: the inter-node leg of allreduce and reduce_scatter under a lossy codec
// (collectives/codec/codec.h). Every rank of the Context here is on a node of its own: these
// run as the flat rows when every node has one rank, and as the cross stage of the hierarchical
// rows otherwise (hierarchical.cc), so intra-node traffic never sees a codec.
//
// Why direct exchanges rather than the ring: a ring reduce-scatter would decode, add and
// re-encode every partial sum at each of its m - 1 steps, so the error would grow with the
// number of nodes and every hop would pay a codec pass. Sending each segment straight to its
// owner encodes every contribution exactly once and moves the same bytes per node, (m - 1)/m of
// the buffer each way; on the few nodes of a nano-cluster the m - 1 concurrent connections cost
// nothing.
//
// Bit-identical results: the owner of a segment accumulates in float32, its own contribution
// first and then the others' in rank order, encodes the sum once, sends those bytes to every
// other rank and decodes the same bytes itself. Every rank therefore ends with decode(the same
// stream) for every segment.
//
// Chunks: each segment is cut into chunks of about ctx.codecChunkBytes() of float32 (a multiple
// of the codec's block; the planner's choice, collectives/planner.h), each an encoded stream of
// its own. Every receive is posted first; the sends are posted
// as soon as each chunk is encoded (the transport moves them while the next one is encoded); the
// owner reduces chunk c and sends it on before chunk c + 1 has arrived.
//
// Error feedback: with a residual, every encode is encodeWithFeedback on the positions it
// encodes (the segments this rank sends in the reduce-scatter, and its own reduced segment in
// the allgather): what the encodings lose now is added to what they encode next time, so over
// many steps the sum of the results equals the sum of the inputs up to the final residual.
#include <algorithm>
#include <cstring>

#include "collectives/algorithm.h"
#include "common/reduce.h"

namespace nanoccl::detail {
namespace {

using Piece = CompressedAllreduce::Piece;

size_t chunksOf(size_t count, size_t chunkElems) { return (count + chunkElems - 1) / chunkElems; }

// Elements per encoded chunk: codecChunkBytes of float32, a whole number of codec blocks.
size_t compressedChunk(const Context& ctx, const codec::Codec& codec,
                       const codec::CodecParams& params) {
  size_t block = 1;
  if (Result<uint32_t> b = codec::resolveBlockSize(codec, params); b.isOk() && b.value() > 0) {
    block = b.value();
  }
  const size_t want = std::max<size_t>(ctx.codecChunkBytes() / sizeof(float), 1);
  return std::max(block, want / block * block);
}

// The chunks of `count` floats at `data`, each with an encoded slot cut from `slots`.
std::vector<Piece> piecesOf(const codec::Codec& codec, const codec::CodecParams& params,
                            float* data, size_t count, size_t chunkElems, char*& slots) {
  std::vector<Piece> out;
  for (size_t off = 0; off < count; off += chunkElems) {
    const size_t n = std::min(chunkElems, count - off);
    const size_t bytes = codec.encodedBytes(n, params);
    out.push_back(Piece{data + off, n, slots, bytes});
    slots += bytes;
  }
  return out;
}

size_t encodedTotal(const codec::Codec& codec, const codec::CodecParams& params, size_t count,
                    size_t chunkElems) {
  size_t bytes = 0;
  for (size_t off = 0; off < count; off += chunkElems) {
    bytes += codec.encodedBytes(std::min(chunkElems, count - off), params);
  }
  return bytes;
}

// Encodes one chunk, with error feedback where `residual` (at the chunk's positions) is given.
// Stochastic rounding (when params ask for it) gets a seed per call, rank and `where` (unique
// per chunk within the call), so no two chunks round with the same random numbers.
Status encodePiece(const Context& ctx, const codec::Codec& codec, codec::CodecParams params,
                   const Piece& p, float* residual, uint64_t where) {
  params.seed ^= (ctx.fingerprint().seq * 0x9e3779b97f4a7c15ull) ^
                 (static_cast<uint64_t>(ctx.rank()) << 56) ^ where;
  if (residual != nullptr) {
    return codec::encodeWithFeedback(codec, p.data, residual, p.count, params, p.stream, p.bytes);
  }
  return codec.encode(p.data, DataType::kFloat32, p.count, params, p.stream, p.bytes);
}

}  // namespace

uint32_t CompressedAllreduce::tags(const Context& ctx, const codec::Codec& codec,
                                   const codec::CodecParams& params, size_t count) {
  // Segment 0 is the largest (evenSplit): its chunks, once for each half of the exchange.
  const size_t segment = evenSplit(count, ctx.size())[0];
  return static_cast<uint32_t>(2 * chunksOf(segment, compressedChunk(ctx, codec, params)));
}

CompressedAllreduce::CompressedAllreduce(Context& ctx, const codec::Codec& codec,
                                         const codec::CodecParams& params, float* data,
                                         size_t count, float* residual, uint32_t tagBase)
    : ctx_(ctx),
      codec_(codec),
      params_(params),
      data_(data),
      residual_(residual),
      tagBase_(tagBase),
      half_(tags(ctx, codec, params, count) / 2) {
  const int n = ctx.size();
  const int me = ctx.rank();
  if (count == 0 || n == 1) return;
  const std::vector<size_t> counts = evenSplit(count, n);
  const std::vector<size_t> starts = prefixOffsets(counts);
  const size_t ce = compressedChunk(ctx, codec, params);
  // Encoded slots: what this rank sends of every other segment, what it receives of its own
  // from every other rank, its reduced segment once, and every other reduced segment.
  const size_t mine = encodedTotal(codec, params, counts[me], ce);
  size_t others = 0;
  for (int j = 0; j < n; ++j) {
    if (j != me) others += encodedTotal(codec, params, counts[j], ce);
  }
  char* slots = ctx.scratch(2 * others + static_cast<size_t>(n) * mine);
  out_.resize(n);
  in_.resize(n);
  gathered_.resize(n);
  reduced_ = piecesOf(codec, params, data + starts[me], counts[me], ce, slots);
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    out_[j] = piecesOf(codec, params, data + starts[j], counts[j], ce, slots);
    in_[j] = piecesOf(codec, params, data + starts[me], counts[me], ce, slots);
    gathered_[j] = piecesOf(codec, params, data + starts[j], counts[j], ce, slots);
  }
  maxChunks_ = chunksOf(counts[0], ce);
}

Status CompressedAllreduce::encode(const Piece& p) {
  float* residual = residual_ != nullptr ? residual_ + (p.data - data_) : nullptr;
  // Blocks of a pipelined call have tag ranges of their own: tagBase_ tells them apart.
  const uint64_t where = (uint64_t{tagBase_} << 32) ^ static_cast<uint64_t>(p.data - data_);
  return encodePiece(ctx_, codec_, params_, p, residual, where);
}

Status CompressedAllreduce::start() {
  const int n = static_cast<int>(out_.size());
  const int me = ctx_.rank();
  // Every receive first: this segment's chunks from everyone, then everyone's reduced chunks.
  rsRecv_.resize(n);
  agRecv_.resize(n);
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    for (size_t c = 0; c < in_[j].size(); ++c) {
      rsRecv_[j].push_back(ctx_.irecv(j, tagBase_ + c, in_[j][c].stream, in_[j][c].bytes));
    }
    for (size_t c = 0; c < gathered_[j].size(); ++c) {
      agRecv_[j].push_back(ctx_.irecv(j, tagBase_ + half_ + c, gathered_[j][c].stream,
                                      gathered_[j][c].bytes));
    }
  }
  // Reduce-scatter sends, chunk by chunk, each peer in turn from the next rank on.
  for (size_t c = 0; c < maxChunks_; ++c) {
    for (int d = 1; d < n; ++d) {
      const int j = (me + d) % n;
      if (c >= out_[j].size()) continue;
      const Piece& p = out_[j][c];
      NANOCCL_CHECK(encode(p));
      sends_.push_back(ctx_.isend(j, tagBase_ + c, p.stream, p.bytes));
    }
  }
  return Status::ok();
}

Status CompressedAllreduce::reduce() {
  const int n = static_cast<int>(out_.size());
  const int me = ctx_.rank();
  // This rank's segment, chunk by chunk: add the others' contributions in rank order, encode
  // the sum once, send it, and take the decoded bytes as this rank's result too.
  for (size_t c = 0; c < reduced_.size(); ++c) {
    const Piece& p = reduced_[c];
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      NANOCCL_CHECK(ctx_.wait(rsRecv_[j][c]));
      NANOCCL_CHECK(codec_.decodeAccumulate(in_[j][c].stream, in_[j][c].bytes, p.data, p.count));
    }
    NANOCCL_CHECK(encode(p));
    for (int d = 1; d < n; ++d) {
      sends_.push_back(ctx_.isend((me + d) % n, tagBase_ + half_ + c, p.stream, p.bytes));
    }
    NANOCCL_CHECK(codec_.decode(p.stream, p.bytes, p.data, p.count));
  }
  return Status::ok();
}

Status CompressedAllreduce::finish() {
  // Everyone else's reduced segments.
  for (size_t j = 0; j < gathered_.size(); ++j) {
    for (size_t c = 0; c < gathered_[j].size(); ++c) {
      const Piece& p = gathered_[j][c];
      NANOCCL_CHECK(ctx_.wait(agRecv_[j][c]));
      NANOCCL_CHECK(codec_.decode(p.stream, p.bytes, p.data, p.count));
    }
  }
  return ctx_.waitAll(sends_);
}

Status CompressedAllreduce::run() {
  NANOCCL_CHECK(start());
  NANOCCL_CHECK(reduce());
  return finish();
}

Status compressedAllreduce(Context& ctx, const codec::Codec& codec,
                           const codec::CodecParams& params, float* data, size_t count,
                           float* residual, uint32_t tagBase) {
  return CompressedAllreduce(ctx, codec, params, data, count, residual, tagBase).run();
}

Status compressedReduceScatter(Context& ctx, const codec::Codec& codec,
                               const codec::CodecParams& params, const std::vector<size_t>& counts,
                               const std::vector<float*>& seg, uint32_t tagBase,
                               const std::vector<float*>& residual) {
  const int n = ctx.size();
  const int me = ctx.rank();
  const size_t ce = compressedChunk(ctx, codec, params);
  size_t bytes = 0;
  for (int j = 0; j < n; ++j) {
    if (j != me) bytes += encodedTotal(codec, params, counts[j], ce);
  }
  bytes += static_cast<size_t>(n) * encodedTotal(codec, params, counts[me], ce);
  char* slots = ctx.scratch(bytes);
  std::vector<std::vector<Piece>> out(n), in(n);
  std::vector<std::vector<Pending>> recvs(n);
  std::vector<Pending> sends;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    out[j] = piecesOf(codec, params, seg[j], counts[j], ce, slots);
    in[j] = piecesOf(codec, params, seg[me], counts[me], ce, slots);
    for (size_t c = 0; c < in[j].size(); ++c) {
      recvs[j].push_back(ctx.irecv(j, tagBase + c, in[j][c].stream, in[j][c].bytes));
    }
  }
  size_t maxChunks = 0;
  for (size_t c : counts) maxChunks = std::max(maxChunks, chunksOf(c, ce));
  for (size_t c = 0; c < maxChunks; ++c) {
    for (int d = 1; d < n; ++d) {
      const int j = (me + d) % n;
      if (c >= out[j].size()) continue;
      const uint64_t where = (uint64_t{tagBase} << 32) ^ (static_cast<uint64_t>(j) << 24) ^ c;
      float* r = residual.empty() ? nullptr : residual[j] + (out[j][c].data - seg[j]);
      NANOCCL_CHECK(encodePiece(ctx, codec, params, out[j][c], r, where));
      sends.push_back(ctx.isend(j, tagBase + c, out[j][c].stream, out[j][c].bytes));
    }
  }
  for (size_t c = 0; c < chunksOf(counts[me], ce); ++c) {
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      NANOCCL_CHECK(ctx.wait(recvs[j][c]));
      const Piece& p = in[j][c];
      NANOCCL_CHECK(codec.decodeAccumulate(p.stream, p.bytes, p.data, p.count));
    }
  }
  return ctx.waitAll(sends);
}

Status allreduceCompressed(Context& ctx, const CallArgs& args) {
  if (args.count == 0) return Status::ok();
  if (args.dtype != DataType::kFloat32) return runInFloat32(allreduceCompressed, ctx, args);
  char* buf = static_cast<char*>(args.recv);
  NANOCCL_CHECK(premultiplied(ctx, args, buf, args.count, buf).status());
  NANOCCL_CHECK(compressedAllreduce(ctx, *args.codec, args.codecParams,
                                    reinterpret_cast<float*>(buf), args.count, args.residual, 0));
  if (args.redop == ReduceOp::kAvg) {
    return divideInPlace(buf, args.count, args.dtype, ctx.size());
  }
  return Status::ok();
}

Status reduceScatterCompressed(Context& ctx, const CallArgs& args) {
  size_t total = 0;
  for (size_t c : args.counts) total += c;
  if (total == 0) return Status::ok();
  if (args.dtype != DataType::kFloat32) return runInFloat32(reduceScatterCompressed, ctx, args);
  // The other segments are encoded straight from the (scaled) input; this rank's own
  // contribution starts the accumulation in its output.
  NANOCCL_ASSIGN_OR_RETURN(const char* in, premultiplied(ctx, args, args.send, total, nullptr));
  const std::vector<size_t> starts = prefixOffsets(args.counts);
  std::vector<float*> seg(ctx.size());
  for (int j = 0; j < ctx.size(); ++j) {
    // Only seg[rank] is written; the others are only read (encoded).
    seg[j] = const_cast<float*>(reinterpret_cast<const float*>(in) + starts[j]);
  }
  float* own = static_cast<float*>(args.recv);
  std::memmove(own, seg[ctx.rank()], args.counts[ctx.rank()] * sizeof(float));
  seg[ctx.rank()] = own;
  // Error feedback: the residual is laid out like the input (segment j at its start).
  std::vector<float*> residual;
  for (int j = 0; args.residual != nullptr && j < ctx.size(); ++j) {
    residual.push_back(args.residual + starts[j]);
  }
  NANOCCL_CHECK(compressedReduceScatter(ctx, *args.codec, args.codecParams, args.counts, seg, 0,
                                        residual));
  if (args.redop == ReduceOp::kAvg) {
    return divideInPlace(own, args.counts[ctx.rank()], args.dtype, ctx.size());
  }
  return Status::ok();
}

Status runInFloat32(Status (*run)(Context&, const CallArgs&), Context& ctx, const CallArgs& args) {
  const bool allreduce = args.op == OpType::kAllreduce;
  size_t inCount = args.count;
  if (!allreduce) {
    inCount = 0;
    for (size_t c : args.counts) inCount += c;
  }
  const size_t outCount = allreduce ? args.count : args.counts[ctx.rank()];
  CallArgs wide = args;
  wide.dtype = DataType::kFloat32;
  auto* in = reinterpret_cast<float*>(ctx.scratch(inCount * sizeof(float)));
  NANOCCL_CHECK(widenToFloat32(in, allreduce ? args.recv : args.send, inCount, args.dtype));
  float* out = in;
  if (!allreduce) out = reinterpret_cast<float*>(ctx.scratch(outCount * sizeof(float)));
  wide.send = in;
  wide.recv = out;
  NANOCCL_CHECK(run(ctx, wide));
  return narrowFromFloat32(args.recv, out, outCount, args.dtype);
}

}  // namespace nanoccl::detail
