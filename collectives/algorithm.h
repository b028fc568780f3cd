// Internal to collectives/: what an algorithm sees of one call, and the helpers it moves
// bytes with. Nothing here is part of the public API.
//
// Threads and ownership
// - A Context lives on the thread running one call (the communicator's worker, or the caller
//   that waits on it: Task::runHere) for the duration of that call. Every algorithm runs
//   synchronously on that thread: it posts requests through the Context, waits on them before
//   the call's deadline, and returns a Status.
// - Temporary memory must come from Context::scratch(): when a call fails, the worker aborts
//   the transport *before* the Context (and its scratch) is released, so a request that is
//   still pending can never write into freed memory. The same holds for the user's buffers,
//   which are released only when the Task completes, after that abort. Where the abort could
//   not end a request (a stuck progress thread or provider), the communicator keeps the scratch
//   until it is destroyed (takeUnfinished()) and the Task tells the caller to keep its
//   buffers too (Task::buffersStillInUse()).
// - On success an algorithm has waited for every request it posted.
// - Hierarchical algorithms run their stages on the groups of the Hierarchy (on the parent's
//   transport, see SubGroup) through child Contexts that share the call's fingerprint,
//   deadline, scratch and byte counts, inside the call: no communicator queue is involved, so a
//   stage can never wait for work queued behind the call that runs it. A pipelined algorithm
//   may run one stage on the Hierarchy's StageHelper thread, whose job ends before the
//   algorithm returns: Contexts may be used from several threads at once (scratch() and the
//   byte counts are thread-safe), each request being waited on by the thread that posted it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/device/device.h"
#include "collectives/topology.h"
#include "common/config.h"
#include "common/deadline.h"
#include "common/dtype.h"
#include "common/op.h"
#include "common/status.h"
#include "transports/transport.h"

namespace nanoccl::detail {

// The arguments of one collective call, as the user gave them. Which fields an op reads:
//   allreduce, reduce, broadcast: recv (in and out), count, root (reduce, broadcast)
//   allgather:      send, count (send count), recv, counts (receive counts per rank)
//   reduce_scatter: send, recv, counts (per rank)
//   alltoall:       send, counts (send counts), recv, recvCounts
//   gather:         send, count (send count), recv and counts on the root, root
//   scatter:        send and counts on the root, recv, count (receive count), root
//   barrier:        nothing
struct CallArgs {
  OpType op = OpType::kNone;
  DataType dtype = DataType::kUInt8;
  ReduceOp redop = ReduceOp::kSum;
  double premulFactor = 1.0;
  int root = -1;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  std::vector<size_t> counts;
  std::vector<size_t> recvCounts;
  // Compression of the inter-node leg (allreduce, reduce_scatter; float32, and float16/bfloat16
  // through runInFloat32): null for a lossless call. Set by the communicator only where a lossy row of the table runs the call.
  const codec::Codec* codec = nullptr;
  codec::CodecParams codecParams;
  // NANOCCL_COMPRESSION=auto on a call that could be compressed: the planner picks the codec
  // (or none) from compression_allow by the cost model and sets `codec`.
  bool codecAuto = false;
  // Error feedback (may be null): floats owned by the caller, `count` for an allreduce and the
  // whole input (sum of counts) for a reduce-scatter; what this rank's encodings lose is kept
  // here and added to what it encodes next time. Its layout is the algorithm's (the same every
  // call of the same sizes on the same topology), not necessarily the input's.
  float* residual = nullptr;
  // The chunk of the compressed exchange, in float32 bytes: the planner's choice (0:
  // config.chunkBytes). Context::codecChunkBytes() hands it to compressed.cc.
  size_t codecChunkBytes = 0;
  // The chunk of the call's ring and chain passes (a lossy plan's node stages), in bytes: the
  // planner's choice (0: config.chunkBytes). Context::chunkBytes() hands it to chunkElements().
  size_t chunkBytes = 0;
  // Connections a peer the call's large messages are striped over (OpFingerprint::lanes; the
  // planner's choice, 0: all of them).
  int lanes = 0;

  // Device memory (collectives/device/device.h): the device that `send` and `recv` live on, or
  // null for host memory. A device call runs on the device rows of the table only.
  std::shared_ptr<Device> device;
  // The device's queue waits for this fence before the call's first operation (the caller's
  // position at the call's issue); may be null.
  std::shared_ptr<Fence> after;

  size_t elemSize() const { return dataTypeSize(dtype); }
  // The size the planner decides by: the bytes one rank contributes to / receives from the
  // call, the same on every rank of a matching call.
  size_t planBytes() const;
};

// One posted request and what it is for (timeout messages name the peer).
struct Pending {
  std::shared_ptr<Request> req;
  int peer = -1;
  bool isSend = false;
  uint32_t tag = 0;
};

// One group of a hierarchical communicator's ranks: the ranks of this node ("local") or the
// ranks with this rank's local rank on every node ("cross"). Built by Communicator::create,
// owned by the communicator. Its stages' messages ride the parent's transport (the routed one
// sends the local group's over shared memory and the cross group's over the network), peer i
// of the group being parent rank ranks[i] there; only a cross group on a rail of its own
// (NANOCCL_RAIL_PER_LOCAL_RANK) has a transport of its own (`own`, numbered by group rank,
// with its own comm id so that its store keys and handshakes never meet the parent's). Either
// is driven by the threads running the parent's current call and aborted by whoever fails it.
struct SubGroup {
  Transport* transport = nullptr;  // the parent's or `own`; null when size == 1 (or not needed)
  std::unique_ptr<Transport> own;
  int rank = 0;
  int size = 1;
  std::vector<int> ranks;  // the parent rank of each member, index = rank in the group
  std::string name;        // "intra-node stage among ranks 2 3 (node 1)", prefixed to its errors
  // Whether `transport` is the parent's (its ranks are `ranks`), not `own`.
  bool rides() const { return transport != nullptr && own == nullptr; }
  // How a Context on this group names its peers on `transport` (Context::setPeerRanks).
  const std::vector<int>* peerRanks() const { return rides() ? &ranks : nullptr; }
};

// One thread beside the one running a call, for a stage that runs at the same time as the
// call's own (the pipelined hierarchical allreduce's cross-node stage, hierarchical.cc). The
// first run() starts it and the destructor joins it (the communicator's teardown, after its
// worker): a communicator creates it at most once, never per call. One job at a time: run()
// returns at once, and the job itself tells its caller that it ended (a Completion).
class StageHelper {
 public:
  StageHelper() = default;
  StageHelper(const StageHelper&) = delete;
  StageHelper& operator=(const StageHelper&) = delete;
  ~StageHelper();
  void run(std::function<void()> job);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool stop_ = false;
  std::thread thread_;
};

// What the hierarchical algorithms need besides the parent Context.
//
// Data is cut into `shards` parts, the smallest number of ranks on any node: local rank s
// (s < shards) of every node carries part s across nodes, over its cross group, whose rank is
// then the node index. Local ranks >= shards (on nodes larger than the smallest) only take part
// in the intra-node stages and have no cross group.
struct Hierarchy {
  Topology topology;
  int shards = 1;
  SubGroup local;
  SubGroup cross;
  // The thread that runs the pipelined allreduce's cross-node stage beside the call's own.
  std::unique_ptr<StageHelper> helper;
};

// Scratch memory handed from one call of a communicator to the next (its calls run one at a
// time). Fresh memory costs a page fault and a zeroed page per 4 KiB on first touch: in a 2x2
// int8 allreduce of 256 MB that was ~5% of the CPU (perf: clear_page_erms), on a machine where
// the CPU sets the pace. Keeps at most kMaxBytes between calls (a 2x2 int8 allreduce of
// 256 MB takes ~68 MB of encoded slots), so an idle communicator holds what its recent calls
// used, up to that. All the pools of a process together keep at most kMaxProcessBytes: a job
// with many process groups (tools that make one per setting, a group per pipeline stage) would
// otherwise keep kMaxBytes in each (28 groups of a grid run were killed for memory). Over that
// cap the pools given to least recently drop their blocks first, so the groups in use keep
// theirs. (Before, the pool giving dropped its own: the first groups to run large calls kept
// the process's share for good, and a group created after them paid fresh pages on every
// call: a 256 MB int8 allreduce on the emulated 2x2 cluster at 10 Gbit/s took 490-530 ms in
// the fourth of four identical groups against 316-343 ms in the others.)
// Thread-safe.
class ScratchPool {
 public:
  static constexpr size_t kMaxBytes = size_t{256} << 20;
  static constexpr size_t kMaxProcessBytes = size_t{512} << 20;
  ScratchPool();
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;
  ~ScratchPool();
  struct Block {
    std::unique_ptr<char[]> mem;
    size_t bytes = 0;
  };
  // The smallest pooled block of at least `bytes`, else a new one.
  Block take(size_t bytes);
  // Pools `blocks` (what a call used), dropping the largest first while this pool holds more
  // than kMaxBytes; then, while all pools of the process hold more than kMaxProcessBytes, the
  // largest blocks of the pools given to least recently (this one last).
  void give(std::vector<Block> blocks);
  size_t pooledBytes() const;
  // What every pool of this process keeps.
  static size_t processPooledBytes() { return processPooled().load(); }

 private:
  static std::atomic<size_t>& processPooled();
  // Drops this pool's largest blocks while the process holds more than kMaxProcessBytes.
  void dropOverProcessCap();
  mutable std::mutex mu_;
  std::vector<Block> free_;
  size_t pooled_ = 0;
};

class Context {
 public:
  // `pool` (may be null): where scratch() takes memory from and gives it back to at the end.
  Context(Transport* transport, int rank, int size, const OpFingerprint& fingerprint,
          const Deadline& deadline, std::chrono::milliseconds timeout, const Config& config,
          const Hierarchy* hierarchy = nullptr, ScratchPool* pool = nullptr)
      : transport_(transport),
        rank_(rank),
        size_(size),
        fingerprint_(fingerprint),
        deadline_(deadline),
        timeout_(timeout),
        config_(config),
        hierarchy_(hierarchy),
        pool_(pool) {}
  ~Context();
  // One stage of a hierarchical algorithm, on one of its groups: the same call (fingerprint,
  // deadline); scratch memory comes from `parent` (so it lives until the worker has aborted
  // every transport of a failed call) and the bytes are counted in `parent` too.
  Context(Context& parent, const SubGroup& group)
      : transport_(group.transport),
        rank_(group.rank),
        size_(group.size),
        fingerprint_(parent.fingerprint_),
        deadline_(parent.deadline_),
        timeout_(parent.timeout_),
        config_(parent.config_),
        codecChunkBytes_(parent.codecChunkBytes_),
        chunkBytes_(parent.chunkBytes_),
        peerRanks_(group.peerRanks()),
        parent_(&parent) {}
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  // A Context of the same transport and call whose messages travel on `lanes` connections a
  // peer (OpFingerprint::lanes), with scratch memory of its own: the tuner's one-socket probe.
  std::unique_ptr<Context> withLanes(int lanes) const {
    OpFingerprint fp = fingerprint_;
    fp.lanes = static_cast<uint8_t>(lanes);
    auto out =
        std::make_unique<Context>(transport_, rank_, size_, fp, deadline_, timeout_, config_);
    out->peerRanks_ = peerRanks_;
    return out;
  }
  // Peer p of this context is rank (*ranks)[p] of its transport (a SubGroup that rides its
  // parent's transport); null: the same number.
  void setPeerRanks(const std::vector<int>* ranks) { peerRanks_ = ranks; }
  // The transport's number of peer `peer` of this context (kAnySource stays itself).
  int transportRank(int peer) const {
    return peerRanks_ != nullptr && peer >= 0 ? (*peerRanks_)[static_cast<size_t>(peer)] : peer;
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Config& config() const { return config_; }
  // The chunk of this call's compressed exchange in float32 bytes (CallArgs::codecChunkBytes,
  // else config.chunkBytes); stages on the hierarchy's groups inherit it.
  size_t codecChunkBytes() const {
    return codecChunkBytes_ != 0 ? codecChunkBytes_ : config_.chunkBytes;
  }
  void setCodecChunkBytes(size_t bytes) { codecChunkBytes_ = bytes; }
  // The chunk of this call's ring and chain passes (CallArgs::chunkBytes, else
  // config.chunkBytes); stages on sub-communicators inherit it.
  size_t chunkBytes() const { return chunkBytes_ != 0 ? chunkBytes_ : config_.chunkBytes; }
  void setChunkBytes(size_t bytes) { chunkBytes_ = bytes; }
  const OpFingerprint& fingerprint() const { return fingerprint_; }
  const Deadline& deadline() const { return deadline_; }
  // The sub-communicators, where the communicator's topology is hierarchical; else null.
  const Hierarchy* hierarchy() const { return hierarchy_; }

  // Posts with this call's fingerprint and `tag`; tags must be unique per (peer, direction)
  // within one call so that matching is unambiguous.
  Pending isend(int peer, uint32_t tag, const void* buf, size_t bytes);
  Pending irecv(int peer, uint32_t tag, void* buf, size_t bytes);
  // Waits for one request before the call's deadline; a timeout names the peer and the tag.
  Status wait(const Pending& p);
  // Waits for every request; returns the first failure at once (the caller's caller aborts
  // the transport, which completes the rest).
  Status waitAll(const std::vector<Pending>& ps);

  // The transport's shared-memory board (transport.h: Board), or null where it has none.
  Board* board() const {
    return transport_ != nullptr && peerRanks_ == nullptr ? transport_->board() : nullptr;
  }
  // One round on board(): publishes `bytes` of `data` under this call's fingerprint and
  // waits, until the call's deadline, for every rank's message (views/sizes as
  // Board::exchange). Counts the bytes as sent to and received from every peer.
  Status boardExchange(const void* data, size_t bytes, std::vector<const char*>& views,
                       std::vector<size_t>& sizes);

  // Uninitialised memory that lives until the call has ended (see the ownership note above).
  char* scratch(size_t bytes);

  // What a failed call leaves behind once its transports were aborted: the requests they could
  // not end (a stuck progress thread or provider still targets their buffers), and the call's
  // scratch memory, which such a request may target. Empty `requests`: everything ended.
  struct Leftover {
    std::vector<std::shared_ptr<Request>> requests;
    std::vector<ScratchPool::Block> scratch;
  };
  // Takes the leftover of this call (and of its stages); on the Context the call ran in.
  Leftover takeUnfinished();

  uint64_t bytesSent() const { return bytesSent_.load(std::memory_order_relaxed); }
  uint64_t bytesReceived() const { return bytesReceived_.load(std::memory_order_relaxed); }

 private:
  Transport* transport_;
  int rank_;
  int size_;
  OpFingerprint fingerprint_;
  Deadline deadline_;
  std::chrono::milliseconds timeout_;
  const Config& config_;
  size_t codecChunkBytes_ = 0;
  size_t chunkBytes_ = 0;
  const std::vector<int>* peerRanks_ = nullptr;
  const Hierarchy* hierarchy_ = nullptr;
  Context* parent_ = nullptr;
  ScratchPool* pool_ = nullptr;
  std::mutex scratchMu_;  // scratch_ and issued_, kept on the call's Context (parent_ null)
  std::vector<ScratchPool::Block> scratch_;
  std::vector<std::shared_ptr<Request>> issued_;  // every request of the call, for Leftover
  std::atomic<uint64_t> bytesSent_{0};
  std::atomic<uint64_t> bytesReceived_{0};
};

// The algorithm table's row type (docs/design.md, convention 3). Rows are listed per op in order of
// preference: under algo "auto" the planner takes the first row of the op whose autoWhen()
// and supports() both hold; a forced name must name a row of the op that supports the call.
struct AlgorithmRow {
  const char* name;
  OpType op;
  const char* description;
  // Whether the algorithm can run this call at all; if not, why (quoted when it was forced).
  Status (*supports)(const CallArgs& args, const Topology& topology);
  // Whether "auto" should pick it (small-message rows say yes up to smallMessageBytes).
  bool (*autoWhen)(const CallArgs& args, const Topology& topology, const Config& config);
  Status (*run)(Context& ctx, const CallArgs& args);
  // Whether run() honours args.codec (compresses the inter-node leg). A call with a codec
  // runs on the first lossy row that supports it; a forced lossless row runs it lossless.
  bool lossy = false;
  // Whether the row runs calls on device memory (CallArgs::device): device calls take only
  // such rows, host calls only the others.
  bool device = false;
};

// ---- Confirmations ----
// A rank that only sends in a call could never notice that its peers disagree with it: two
// ranks that both believe they are the root of a broadcast would both just send, and both
// "succeed". So in rooted algorithms every send-only edge is confirmed by an empty message
// back, under the same tag as the data edge: when the ranks disagree, the data that one of
// them sends meets the other's confirmation receive, and the transport's fingerprint check
// reports the mismatch on both sides.
extern const char kAckByte[1];
// Where empty confirmation receives point (nothing is ever written there).
char* ackSink();

// ---- Building blocks shared by several algorithms (ring.cc, tree.cc) ----

// Splits `count` elements into `parts` runs that differ by at most one element.
std::vector<size_t> evenSplit(size_t count, int parts);
// Prefix sums: offsets[i] = sum of counts[0..i).
std::vector<size_t> prefixOffsets(const std::vector<size_t>& counts);

// Elements per pipelined chunk for segments of up to `maxSegment` elements, from
// ctx.chunkBytes(), raised where needed so that `phases` ring passes fit in the tag space.
size_t chunkElements(const Context& ctx, size_t elemSize, size_t maxSegment, int phases);
// Tags one ring pass over these segments uses: (size - 1) x the most chunks of a segment.
uint32_t ringTags(const Context& ctx, const std::vector<size_t>& counts, size_t chunkElems);

// Ring reduce-scatter, chunked and pipelined: segment i (counts[i] elements) is reduced over
// all ranks; afterwards acc[rank] holds the reduction of every rank's src[rank]. src[i] is
// this rank's input for segment i, acc[i] where its partial sums go (acc may equal src).
// Sends acc[i] chunks to the right neighbour as soon as they are reduced.
Status ringReduceScatter(Context& ctx, const std::vector<size_t>& counts,
                         const std::vector<const char*>& src, const std::vector<char*>& acc,
                         DataType dtype, ReduceOp op, size_t chunkElems, uint32_t tagBase);
// Ring allgather: buf[rank] holds this rank's segment; afterwards every buf[i] holds rank
// i's segment. Received chunks are forwarded as soon as they arrive.
Status ringAllgather(Context& ctx, const std::vector<size_t>& counts, const std::vector<char*>& buf,
                     size_t elemSize, size_t chunkElems, uint32_t tagBase);

// Binomial-tree reduce of `count` elements to `root`. `input` is this rank's contribution;
// the result lands in `out` on the root (out may equal input there). Non-roots never write
// to `input` or `out`. Uses tags [tagBase, tagBase + 32).
Status treeReduce(Context& ctx, const char* input, char* out, size_t count, DataType dtype,
                  ReduceOp op, int root, uint32_t tagBase);
// Binomial-tree broadcast of `buf` from `root`. Uses tags [tagBase, tagBase + 32).
Status treeBroadcast(Context& ctx, char* buf, size_t bytes, int root, uint32_t tagBase);

// kPremulSum's local step: a copy of `input` scaled by the factor (the same pointer when no
// scaling is needed, or into `inPlace` when the caller's buffer may be overwritten).
Result<const char*> premultiplied(Context& ctx, const CallArgs& args, const void* input,
                                  size_t count, char* inPlace);

// kAvg and kPremulSum reduce as kSum (their scaling is a separate step).
ReduceOp kernelOp(ReduceOp op);

// ---- The algorithms (one function per table row) ----
Status allreduceRing(Context& ctx, const CallArgs& args);
Status allreduceRecursiveDoubling(Context& ctx, const CallArgs& args);
Status allreduceTree(Context& ctx, const CallArgs& args);
Status reduceTree(Context& ctx, const CallArgs& args);
Status reduceRing(Context& ctx, const CallArgs& args);
Status broadcastTree(Context& ctx, const CallArgs& args);
Status broadcastRing(Context& ctx, const CallArgs& args);
Status allgatherRing(Context& ctx, const CallArgs& args);
Status reduceScatterRing(Context& ctx, const CallArgs& args);
Status alltoallPairwise(Context& ctx, const CallArgs& args);
Status gatherDirect(Context& ctx, const CallArgs& args);
Status scatterDirect(Context& ctx, const CallArgs& args);
Status barrierDissemination(Context& ctx, const CallArgs& args);

// The shared-memory board (board.cc): one round each, for calls of up to kBoardMessageBytes a
// rank on a transport whose ranks share memory; where the transport has no board (tcp
// within the node, a node without shm) they run the next row's algorithm instead.
Status allreduceBoard(Context& ctx, const CallArgs& args);
Status broadcastBoard(Context& ctx, const CallArgs& args);
Status barrierBoard(Context& ctx, const CallArgs& args);

// Hierarchical (hierarchical.cc): an intra-node stage, an inter-node stage run by every local
// rank < Hierarchy::shards at once, and an intra-node stage again. Need ctx.hierarchy().
Status allreduceHierarchical(Context& ctx, const CallArgs& args);
Status reduceScatterHierarchical(Context& ctx, const CallArgs& args);
Status allgatherHierarchical(Context& ctx, const CallArgs& args);
Status broadcastHierarchical(Context& ctx, const CallArgs& args);

// The flat allreduce a cross group runs on a shard (tags from 0): recursive doubling for small
// shards, the ring otherwise (both give every member the same bits).
Status crossAllreduce(Context& cross, const CallArgs& shard);
// The ring allreduce of `count` elements at `buf` over `ctx`, with tags from `tagBase` (the
// table's allreduceRing always starts at tag 0; the blocks of one call need their own tags):
// 2 x ringTags() of evenSplit(count, ctx.size()) at `chunkElems`.
Status ringAllreduceAt(Context& ctx, char* buf, size_t count, DataType dtype, ReduceOp op,
                       size_t chunkElems, uint32_t tagBase);

// Device rows (collectives/device/rows.cc): calls on device memory, through args.device.
// "device_node" (one node): the call is one node stage (NCCL on the CUDA device). 
// "device_staged" (several nodes): allreduce reduces in the node into shards, every local rank
// carries its shard across nodes through host staging memory chunk by chunk (the copies of
// the neighbouring chunks overlap the network), then gathers in the node; broadcast,
// allgather and reduce_scatter copy to the host, run the host path's row there and copy back.
Status allreduceDeviceNode(Context& ctx, const CallArgs& args);
Status allreduceDeviceStaged(Context& ctx, const CallArgs& args);
Status broadcastDeviceNode(Context& ctx, const CallArgs& args);
Status broadcastDeviceStaged(Context& ctx, const CallArgs& args);
Status allgatherDeviceNode(Context& ctx, const CallArgs& args);
Status allgatherDeviceStaged(Context& ctx, const CallArgs& args);
Status reduceScatterDeviceNode(Context& ctx, const CallArgs& args);
Status reduceScatterDeviceStaged(Context& ctx, const CallArgs& args);
// Runs a device call on `row`: the device's queue waits for args.after, the row queues the
// call's work, and *end gets a fence after all of it (Task::deviceEnd()).
Status runDeviceCall(Context& ctx, const CallArgs& args, const AlgorithmRow& row,
                     std::shared_ptr<Fence>* end);

// Compressed (compressed.cc): the inter-node leg under args.codec. Every rank of `ctx` is on a
// node of its own (the flat rows, and the cross stage of the hierarchical ones).
//
// Allreduce of `count` float32 at `data`: direct reduce-scatter of encoded segments, float32
// accumulation by the segment's owner, then the owner encodes its reduced segment once and
// every rank (the owner too) decodes those bytes, so all ranks end with the same bits. Not
// averaged (the caller divides). `residual` (null, or `count` floats at the same positions)
// is the error feedback. Chunked: encoding, the network and decoding overlap. Uses tags
// [tagBase, tagBase + tags(ctx, codec, params, count)).
//
// In three steps, so that a pipeline can start the next block's exchange before this one's
// allgather has arrived: start() posts every receive and sends the encoded segments; reduce()
// adds what arrived for this rank's segment, sends the encoded sum and decodes it; finish()
// decodes everyone else's sums and waits for the sends. Each once, in that order, on one
// thread; scratch comes from ctx.
class CompressedAllreduce {
 public:
  CompressedAllreduce(Context& ctx, const codec::Codec& codec, const codec::CodecParams& params,
                      float* data, size_t count, float* residual, uint32_t tagBase);
  Status start();
  Status reduce();
  Status finish();
  Status run();  // all three
  static uint32_t tags(const Context& ctx, const codec::Codec& codec,
                       const codec::CodecParams& params, size_t count);

  // One chunk of one segment: where its float32 live and where its encoded stream goes.
  struct Piece {
    float* data;
    size_t count;
    char* stream;
    size_t bytes;
  };

 private:
  Status encode(const Piece& p);

  Context& ctx_;
  const codec::Codec& codec_;
  codec::CodecParams params_;
  float* data_;
  float* residual_;
  uint32_t tagBase_;
  uint32_t half_;  // the allgather's tags start at tagBase_ + half_
  size_t maxChunks_ = 0;
  std::vector<std::vector<Piece>> out_, in_, gathered_;  // [peer][chunk]
  std::vector<Piece> reduced_;                           // this rank's segment
  std::vector<std::vector<Pending>> rsRecv_, agRecv_;
  std::vector<Pending> sends_;
};
// All three steps at once (CompressedAllreduce::run).
Status compressedAllreduce(Context& ctx, const codec::Codec& codec,
                           const codec::CodecParams& params, float* data, size_t count,
                           float* residual, uint32_t tagBase);
// Reduce-scatter: segment i (counts[i] float32 at seg[i]) goes to rank i, encoded; this rank
// accumulates what it receives into seg[rank] (which holds its own contribution). The other
// segments are only read. `residual`: empty, or per segment counts[i] floats of error feedback
// for the segments this rank encodes (residual[rank] unused). Tags [tagBase, tagBase + chunks
// of the largest segment).
Status compressedReduceScatter(Context& ctx, const codec::Codec& codec,
                               const codec::CodecParams& params, const std::vector<size_t>& counts,
                               const std::vector<float*>& seg, uint32_t tagBase,
                               const std::vector<float*>& residual = {});
// The flat rows: every node has one rank.
Status allreduceCompressed(Context& ctx, const CallArgs& args);
Status reduceScatterCompressed(Context& ctx, const CallArgs& args);
// A float16/bfloat16 allreduce or reduce_scatter on a flat compressed row: `run` runs it in
// float32 on widened copies (accumulated in float32, encoded from float32, the residual float32
// as for float32 calls), and the result is rounded back once. The hierarchical rows widen only
// what crosses nodes (hierarchical.cc).
Status runInFloat32(Status (*run)(Context&, const CallArgs&), Context& ctx, const CallArgs& args);

// World size 1: the result of every op as plain local copies.
Status runLocal(const CallArgs& args);

}  // namespace nanoccl::detail
