#include <algorithm>
#include <cstring>
#include <list>
#include <mutex>
#include <numeric>

#include "collectives/algorithm.h"
#include "common/reduce.h"

namespace nanoccl::detail {

size_t CallArgs::planBytes() const {
  const size_t es = elemSize();
  switch (op) {
    case OpType::kAllgather:
    case OpType::kReduceScatter:
    case OpType::kAlltoall:
      return std::accumulate(counts.begin(), counts.end(), size_t{0}) * es;
    default:
      return count * es;
  }
}

Pending Context::isend(int peer, uint32_t tag, const void* buf, size_t bytes) {
  Context* root = this;
  for (Context* c = this; c != nullptr; c = c->parent_) {
    c->bytesSent_.fetch_add(bytes, std::memory_order_relaxed);
    root = c;
  }
  Envelope env{fingerprint_, tag};
  Pending p{transport_->isend(transportRank(peer), env, buf, bytes), peer, true, tag};
  std::lock_guard<std::mutex> lock(root->scratchMu_);
  root->issued_.push_back(p.req);
  return p;
}

Status Context::boardExchange(const void* data, size_t bytes, std::vector<const char*>& views,
                              std::vector<size_t>& sizes) {
  Board* b = board();
  if (b == nullptr) return internalError("the transport has no board");
  const uint64_t out = bytes * static_cast<uint64_t>(size_ - 1);
  for (Context* c = this; c != nullptr; c = c->parent_) {
    c->bytesSent_.fetch_add(out, std::memory_order_relaxed);
  }
  NANOCCL_CHECK(b->exchange(fingerprint_, data, bytes, deadline_, views, sizes));
  uint64_t in = 0;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) in += sizes[static_cast<size_t>(r)];
  }
  for (Context* c = this; c != nullptr; c = c->parent_) {
    c->bytesReceived_.fetch_add(in, std::memory_order_relaxed);
  }
  return Status::ok();
}

Pending Context::irecv(int peer, uint32_t tag, void* buf, size_t bytes) {
  Context* root = this;
  for (Context* c = this; c != nullptr; c = c->parent_) {
    c->bytesReceived_.fetch_add(bytes, std::memory_order_relaxed);
    root = c;
  }
  Envelope env{fingerprint_, tag};
  Pending p{transport_->irecv(transportRank(peer), env, buf, bytes), peer, false, tag};
  std::lock_guard<std::mutex> lock(root->scratchMu_);
  root->issued_.push_back(p.req);
  return p;
}

Context::Leftover Context::takeUnfinished() {
  Leftover out;
  std::lock_guard<std::mutex> lock(scratchMu_);
  for (auto& r : issued_) {
    if (!r->test()) out.requests.push_back(std::move(r));
  }
  issued_.clear();
  if (!out.requests.empty()) out.scratch.swap(scratch_);
  return out;
}

Status Context::wait(const Pending& p) {
  Status s = p.req->wait(deadline_);
  if (s.code() == StatusCode::kTimeout) {
    // The transport's timeout says nothing about which step starved; this does, and what the
    // transport sees stuck on the way to that peer, if anything.
    const int peer = transportRank(p.peer);  // as the transport's errors name it
    const std::string stalled = transport_->stallReport(peer);
    return timeoutError("timed out after " + std::to_string(timeout_.count()) + " ms waiting " +
                        (p.isSend ? "to send to rank " : "to receive from rank ") +
                        std::to_string(peer) + " (tag " + std::to_string(p.tag) + "); " +
                        (stalled.empty() ? "did every rank make this call?" : stalled));
  }
  return s;
}

Status Context::waitAll(const std::vector<Pending>& ps) {
  for (const Pending& p : ps) NANOCCL_CHECK(wait(p));
  return Status::ok();
}

ScratchPool::Block ScratchPool::take(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->bytes >= bytes && (best == free_.end() || it->bytes < best->bytes)) best = it;
    }
    if (best != free_.end()) {
      Block b = std::move(*best);
      free_.erase(best);
      pooled_ -= b.bytes;
      processPooled().fetch_sub(b.bytes);
      return b;
    }
  }
  return Block{std::unique_ptr<char[]>(new char[bytes]), bytes};
}

std::atomic<size_t>& ScratchPool::processPooled() {
  static std::atomic<size_t> bytes{0};
  return bytes;
}

namespace {

// The live pools of the process, the one given to least recently first. Lock order: this
// mutex, then a pool's.
struct PoolOrder {
  std::mutex mu;
  std::list<ScratchPool*> pools;
};

PoolOrder& poolOrder() {
  static PoolOrder* order = new PoolOrder;  // never destroyed: pools may outlive statics
  return *order;
}

}  // namespace

ScratchPool::ScratchPool() {
  PoolOrder& o = poolOrder();
  std::lock_guard<std::mutex> lock(o.mu);
  o.pools.push_back(this);
}

ScratchPool::~ScratchPool() {
  PoolOrder& o = poolOrder();
  std::lock_guard<std::mutex> lock(o.mu);  // no other pool's give() is dropping our blocks
  o.pools.remove(this);
  processPooled().fetch_sub(pooled_);
}

void ScratchPool::give(std::vector<Block> blocks) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Block& b : blocks) {
      pooled_ += b.bytes;
      processPooled().fetch_add(b.bytes);
      free_.push_back(std::move(b));
    }
    std::sort(free_.begin(), free_.end(),
              [](const Block& a, const Block& b) { return a.bytes > b.bytes; });
    // Over this pool's cap: drop the largest first (one huge call's memory is not kept for
    // good).
    while (!free_.empty() && pooled_ > kMaxBytes) {
      pooled_ -= free_.front().bytes;
      processPooled().fetch_sub(free_.front().bytes);
      free_.erase(free_.begin());
    }
  }
  PoolOrder& o = poolOrder();
  std::lock_guard<std::mutex> lock(o.mu);
  o.pools.remove(this);
  o.pools.push_back(this);  // given to last
  for (ScratchPool* p : o.pools) {
    if (processPooled().load() <= kMaxProcessBytes) break;
    p->dropOverProcessCap();
  }
}

void ScratchPool::dropOverProcessCap() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!free_.empty() && processPooled().load() > kMaxProcessBytes) {
    pooled_ -= free_.front().bytes;
    processPooled().fetch_sub(free_.front().bytes);
    free_.erase(free_.begin());
  }
}

size_t ScratchPool::pooledBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pooled_;
}

Context::~Context() {
  if (pool_ != nullptr && !scratch_.empty()) pool_->give(std::move(scratch_));
}

char* Context::scratch(size_t bytes) {
  if (parent_ != nullptr) return parent_->scratch(bytes);
  ScratchPool::Block b = pool_ != nullptr
                             ? pool_->take(bytes)
                             : ScratchPool::Block{std::unique_ptr<char[]>(
                                                      new char[std::max<size_t>(bytes, 1)]),
                                                  std::max<size_t>(bytes, 1)};
  std::lock_guard<std::mutex> lock(scratchMu_);
  scratch_.push_back(std::move(b));
  return scratch_.back().mem.get();
}

const char kAckByte[1] = {0};

char* ackSink() {
  static char sink[1];
  return sink;
}

std::vector<size_t> evenSplit(size_t count, int parts) {
  std::vector<size_t> out(parts);
  const size_t base = count / parts;
  const size_t extra = count % parts;
  for (int i = 0; i < parts; ++i) out[i] = base + (static_cast<size_t>(i) < extra ? 1 : 0);
  return out;
}

std::vector<size_t> prefixOffsets(const std::vector<size_t>& counts) {
  std::vector<size_t> out(counts.size());
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    out[i] = at;
    at += counts[i];
  }
  return out;
}

size_t chunkElements(const Context& ctx, size_t elemSize, size_t maxSegment, int phases) {
  size_t ce = std::max<size_t>(1, ctx.chunkBytes() / std::max<size_t>(elemSize, 1));
  // Tags are 32-bit and unique per message within a call; keep well inside that.
  constexpr uint64_t kMaxTags = uint64_t{1} << 30;
  for (;;) {
    const uint64_t chunks = (maxSegment + ce - 1) / ce;
    if (static_cast<uint64_t>(ctx.size()) * chunks * static_cast<uint64_t>(phases) < kMaxTags) {
      return ce;
    }
    ce *= 2;
  }
}

uint32_t ringTags(const Context& ctx, const std::vector<size_t>& counts, size_t chunkElems) {
  size_t maxChunks = 0;
  for (size_t c : counts) maxChunks = std::max(maxChunks, (c + chunkElems - 1) / chunkElems);
  return static_cast<uint32_t>((ctx.size() - 1) * maxChunks);
}

Result<const char*> premultiplied(Context& ctx, const CallArgs& args, const void* input,
                                  size_t count, char* inPlace) {
  if (args.redop != ReduceOp::kPremulSum) return static_cast<const char*>(input);
  const size_t bytes = count * args.elemSize();
  char* dst = inPlace != nullptr ? inPlace : ctx.scratch(bytes);
  if (dst != input && bytes > 0) std::memcpy(dst, input, bytes);
  NANOCCL_CHECK(scaleInPlace(dst, count, args.dtype, args.premulFactor));
  return static_cast<const char*>(dst);
}

namespace {

void copyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

}  // namespace

Status runLocal(const CallArgs& args) {
  const size_t es = args.elemSize();
  auto finishReduction = [&](void* buf, size_t count) -> Status {
    if (args.redop == ReduceOp::kPremulSum) {
      NANOCCL_CHECK(scaleInPlace(buf, count, args.dtype, args.premulFactor));
    }
    if (args.redop == ReduceOp::kAvg) NANOCCL_CHECK(divideInPlace(buf, count, args.dtype, 1));
    return Status::ok();
  };
  switch (args.op) {
    case OpType::kAllreduce:
    case OpType::kReduce:
      return finishReduction(args.recv, args.count);
    case OpType::kReduceScatter:
      copyBytes(args.recv, args.send, args.counts[0] * es);
      return finishReduction(args.recv, args.counts[0]);
    case OpType::kAllgather:
    case OpType::kGather:
    case OpType::kScatter:
      copyBytes(args.recv, args.send, args.count * es);
      return Status::ok();
    case OpType::kAlltoall:
      copyBytes(args.recv, args.send, args.counts[0] * es);
      return Status::ok();
    case OpType::kBroadcast:
    case OpType::kBarrier:
      return Status::ok();
    default:
      return internalError(std::string("no local path for ") + opTypeName(args.op));
  }
}

}  // namespace nanoccl::detail
