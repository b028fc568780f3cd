// Communicator: one group of ranks and the collectives it runs.
//
// Contract (as in ProcessGroupGloo): every rank calls the collectives of a communicator in the
// same order, with matching arguments. Each call is stamped with a sequence number that only
// increases and an OpFingerprint (op, dtype, count, root, reduction, sequence number) that
// travels in every frame header. A violation is detected and reported as kMismatch naming both
// ranks and both calls; the rank that sees it aborts the communicator, so every rank's pending
// and later calls fail (kPeerError quoting the first error) within the timeout, never hang.
//
// Threads and ownership
// - Calls may be made from any thread, but their order defines the sequence; one thread at a
//   time is the normal use (torch's).
// - Each call is queued and returns a Task at once; a worker thread runs the queued calls one
//   after another, in call order; the transport's progress thread moves the bytes. A thread
//   that waits on the Task of the next queued call while none runs takes the call and runs it
//   itself (Task::runHere), so a blocking call costs no thread hand-over; the order stays.
//   The worker is not woken for such a call at once (handOver() says why and when it is). Buffers
//   passed to a call belong to the communicator until its Task completes.
// - Calls issued from a call's completion (a torch future's callbacks) go in a CallScope: they
//   run before any other call not yet started, so every rank runs them at the same place
//   whenever its callback happens to run. Sequence numbers are given when a call starts, in
//   the order calls run.
// - Point-to-point send/recv are not queued behind collectives and not sequence-numbered: they
//   are posted to the transport at once (so irecv-then-isend pairs on two ranks cannot
//   deadlock) and match by (peer, tag) in order; kAnySource receives from whoever sends first.
// - Every Task completes within the communicator's timeout of the moment it was issued (the
//   call that returned it), done or failed with a Status: time spent queued behind earlier
//   calls counts, as in ProcessGroupNCCL. The same holds for p2p and for the torch Works
//   (backend/work_deadline.h).
// - The destructor aborts pending Tasks, joins the threads and closes every socket.
//
// Topology (collectives/topology.h)
// - create() exchanges every rank's node id through the store. Where this rank shares its node
//   with other ranks, the main transport is routed (transports/routed/): collective messages
//   between ranks of one node go through shared memory, the rest (other nodes, and every
//   point-to-point message) over the inter-node transport (NANOCCL_TRANSPORT, from the
//   transport table: chooseTransports). NANOCCL_INTRA_TRANSPORT: "auto" routes where shm is
//   built in, "shm" requires it, "tcp" keeps the inter-node transport alone.
// - Where the topology is
//   hierarchical (several nodes, some with several ranks) it also connects two internal
//   sub-communicators: "local" (the ranks of this node; over shm when built in, else tcp;
//   NANOCCL_INTRA_TRANSPORT forces one) and "cross" (local rank l of every node; over the
//   inter-node transport). Only the thread running the current call (the worker, or a caller in
//   Task::runHere) drives them, inside the "hierarchical" algorithms; they share this
//   communicator's sequence numbers, timeout and failure state.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/device/device.h"
#include "collectives/store.h"
#include "collectives/topology.h"
#include "collectives/tuning.h"
#include "common/completion.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/op.h"
#include "common/status.h"
#include "transports/transport.h"

namespace nanoccl {

class Communicator;

// Memory that must outlive a communicator's transports: what a failed call's unfinished
// transfers may still target (Task::buffersStillInUse()). The communicator releases it once
// its transports are destroyed; what is handed over after that is safe to free at any time.
// Thread-safe.
class KeptBuffers {
 public:
  void keep(std::shared_ptr<void> what) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_.push_back(std::move(what));
  }
  void release() {
    std::vector<std::shared_ptr<void>> out;
    std::lock_guard<std::mutex> lock(mu_);
    out.swap(kept_);
  }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<void>> kept_;
};

// The completion of a call that runs user code which may issue more calls: a torch Future's
// callbacks (PyTorch's PowerSGD hook issues an allreduce inside the previous one's `then`).
// Such a callback runs on some thread at some time after the call; the calls it issues must
// still take the same place in the call order on every rank. A scope gives them one: calls
// issued inside it (on a thread within a CallScope::Enter) run before any other call that has
// not started, in the order they were issued, as if the callback had run inline at its call's
// end (NCCL's order, where a CUDA future is complete at issue). Other calls wait until the
// scope is closed and its calls have run; scopes nest. A callback that waits on a call issued
// outside its scope after the scope's call (not inside) would wait on a call held behind
// itself: that call then fails at its deadline with an error saying so, never hangs.
// Opened by the communicator for a call issued under a ScopeRequest; closed by its holder (the
// code that ran the callbacks) or its destructor.
// Thread-safe.
class CallScope {
 public:
  ~CallScope() { close(); }
  // No more calls will be issued inside: the calls held behind it may run once its own have.
  // Idempotent.
  void close();

  // Calls this thread issues on the scope's communicator join the scope while an Enter lives
  // (null: nothing). Nests; destroy in reverse order on the thread that made it.
  class Enter {
   public:
    explicit Enter(std::shared_ptr<CallScope> scope);
    ~Enter();
    Enter(const Enter&) = delete;
    Enter& operator=(const Enter&) = delete;

   private:
    std::shared_ptr<CallScope> scope_;
    CallScope* previous_;
  };

 private:
  friend class Communicator;
  std::weak_ptr<Communicator> owner_;
};

// While one lives, the next collective this thread queues (on any Communicator) asks `want`
// where it ends by running successfully (once, on the thread that ran it, before any later call
// can start) whether its completion runs user code that may issue calls; if so a CallScope is
// opened for it (Task::scope()). Given at the issue, so that no call can run before it is
// asked. The torch Work makes one around queueing its last call. Not nested.
class ScopeRequest {
 public:
  explicit ScopeRequest(std::function<bool()> want);
  ~ScopeRequest();
  ScopeRequest(const ScopeRequest&) = delete;
  ScopeRequest& operator=(const ScopeRequest&) = delete;

 private:
  std::function<bool()> want_;
};

// One queued call. Thread-safe.
class Task {
 public:
  bool test() const;
  // Waits until the task completes or the deadline passes (then kTimeout; the task itself is
  // still bounded by the communicator's timeout). Runs the call here first where runHere() can.
  Status wait(const Deadline& deadline) const;
  // Runs the call on the calling thread if it is the next queued call of its communicator and
  // no call is running; else does nothing. Back-to-back calls then cost no hand-over to the
  // worker thread and back (two thread wake-ups, tens of microseconds each). Call order is
  // kept: only the head of the queue is taken, and the worker waits while it runs.
  // `waiter`: the caller's own deadline. A call run here holds this thread until the call's
  // deadline, so where the caller's is earlier the call goes to the worker instead and the
  // caller's wait can end at its own deadline.
  void runHere(const Deadline& waiter = Deadline::never()) const;
  // The final status; meaningful once test() is true.
  Status status() const;
  // Runs `cb` once with the final status: on the thread that ran the call (the worker, or a
  // caller in runHere), or at once if already done.
  void onComplete(std::function<void(const Status&)> cb);
  // The Task's Completion (status and source), for Completion::all over several Tasks.
  Completion& completion() { return done_; }
  // For receives: the rank the message came from.
  int source() const;
  // True when the call failed and aborting the transports did not end every transfer on its
  // buffers (a stuck progress thread or provider still targets them; the transport logged
  // it). The communicator then keeps its own memory of the call, and the caller must not
  // release or reuse the buffers it passed before the communicator is destroyed: hand them to
  // keepBuffers() (the torch backend does). Set before completion.
  bool buffersStillInUse() const { return buffersInUse_.load(std::memory_order_acquire); }
  // Where buffersStillInUse(): keeps `buffers` alive until the communicator's transports are
  // destroyed, even if the communicator is being destroyed right now. Otherwise does nothing.
  void keepBuffers(std::shared_ptr<void> buffers) const {
    if (buffersStillInUse()) keeper_->keep(std::move(buffers));
  }

  // Used by the thread that ran the call.
  void complete(const Status& status, int source = -1);

  // The scope opened for this call's completion (ScopeRequest; close it when the completion
  // is over), or null. Set before the Task completes.
  std::shared_ptr<CallScope> scope() const { return scope_; }

  // A device call (Communicator::deviceCall) that succeeded: a fence of its device after the
  // call's last queued operation. The Task completes when the call's work is all queued (its
  // host stages are over); the device is done with the call once it has passed this fence.
  // Null otherwise. Set before the Task completes.
  std::shared_ptr<Fence> deviceEnd() const { return deviceEnd_; }

 private:
  Completion done_;
  std::shared_ptr<KeptBuffers> keeper_;  // set before buffersInUse_
  std::atomic<bool> buffersInUse_{false};
  // The communicator that queued it (collectives only), for runHere(); set before the Task is
  // handed to anyone.
  friend class Communicator;
  std::weak_ptr<Communicator> owner_;
  std::function<bool()> holdQuery_;   // ScopeRequest's; read by the thread that ran the call
  std::shared_ptr<CallScope> scope_;  // set by that thread before completing the Task
  std::shared_ptr<Fence> deviceEnd_;  // likewise
};

struct CommunicatorOptions {
  int rank = 0;
  int size = 1;
  // Rendezvous. Keys are written under "nanoccl/<commId>/..." so that several communicators
  // (torch subgroups) can share one store.
  std::shared_ptr<Store> store;
  std::string commId = "0";
  Config config;
  // Every call's deadline; also bounds connection setup.
  std::chrono::milliseconds timeout{300000};
  // This rank's node; config.nodeId (NANOCCL_NODE_ID) overrides it. Empty: defaultNodeId().
  std::string nodeId;
  // For tests (fault injection): wraps each transport the communicator creates, before setup.
  std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>)> wrapTransport;
};

// Bytes moved, as the study and nanoccl.stats() report them: the one stats type, made by
// Communicator::stats() (the sub-communicators' traffic merged in with operator+=) and turned
// into nanoccl.stats()'s dict once, by the Python module.
struct CommStats {
  int rank = 0;
  int size = 0;
  // Every rank's node id (index = rank): NANOCCL_NODE_ID, else torchrun's node, else the host
  // and network namespace (collectives/topology.h).
  std::vector<std::string> nodes;
  // Payload per peer (index = rank), whichever transport carried it: the sub-communicators'
  // traffic is counted under the parent ranks of their members.
  std::vector<PeerCounters> perPeer;
  // Bytes sent/received by this rank per op type (index = OpType).
  std::vector<uint64_t> bytesSentPerOp;
  std::vector<uint64_t> bytesReceivedPerOp;
  uint64_t calls = 0;
  // perPeer summed by link class: peers on this rank's node (intra) and on other nodes (inter).
  uint64_t intraNodeBytesSent = 0;
  uint64_t intraNodeBytesReceived = 0;
  uint64_t interNodeBytesSent = 0;
  uint64_t interNodeBytesReceived = 0;
  // Collective calls run per algorithm, as ("allreduce/hierarchical", calls): what the planner
  // chose. Only algorithms that ran are listed; calls on a one-rank communicator are not.
  std::vector<std::pair<std::string, uint64_t>> callsPerAlgorithm;
  // perPeer summed per transport that carried it, by table name: ("tcp", ...), ("shm", ...).
  // Every transport the communicator holds is listed, in first-use order, even without traffic.
  std::vector<std::pair<std::string, PeerCounters>> perTransport;
  // Payload bytes per network interface of the tcp transports (Transport::railCounters(): one
  // entry a rail), every transport of the communicator added up.
  std::vector<RailCounters> perRail;
  // Calls the cost model predicted (a link profile is in force, collectives/tuning.h), per
  // "op/row" or "op/row/codec": how many, and the predicted and the measured seconds summed
  // (measured on this rank, from the start of the call's run to its end).
  struct Timing {
    std::string what;
    uint64_t calls = 0;
    double predictedSeconds = 0;
    double measuredSeconds = 0;
  };
  std::vector<Timing> modelled;
  // Failed calls whose transfers the aborted transports could not end (Task::
  // buffersStillInUse()): their memory is kept until the communicator is destroyed.
  uint64_t callsWithKeptBuffers = 0;

  // Adds `o`'s counts: per rank, op and link class, and by name (algorithm, transport, rail,
  // modelled row; new names appended in order). rank, size and nodes stay this one's.
  CommStats& operator+=(const CommStats& o);
};

// Compression of one allreduce's inter-node leg, asked for by the caller (see
// Communicator::allreduceCompressed; the plain calls follow NANOCCL_COMPRESSION).
struct CompressionRequest {
  std::string codec = "int8";  // a name from kCodecNames (common/op.h)
  uint32_t blockSize = 0;      // int8/int4 elements per scale; 0: compression_block, else default
  // Error feedback: `count` floats the caller owns and keeps between calls (zeros at first),
  // or null. Each rank's residual holds what its own encodings lost.
  float* residual = nullptr;
};

// A collective on device memory (collectives/device/device.h): the same call as on host memory,
// run by the device rows of the table on the communicator's own transports.
struct DeviceCall {
  OpType op = OpType::kAllreduce;  // kAllreduce, kBroadcast, kAllgather or kReduceScatter
  DataType dtype = DataType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;  // allreduce, reduce_scatter
  double premulFactor = 1.0;
  int root = 0;  // broadcast
  // allreduce, broadcast: `count` elements, in place on `recv` (`send` null, `recv`, or the
  // input; a broadcast reads it on the root only).
  // allgather: `count` elements at `send`; `recv` gets size() x count, in rank order.
  // reduce_scatter: size() x count elements at `send`; `recv` gets this rank's `count`.
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  // Where the buffers live; kept alive by the call until it completes.
  std::shared_ptr<Device> device;
  // The device's queue waits for this fence before the call's first operation (the caller's
  // position at the call's issue); may be null.
  std::shared_ptr<Fence> after;
  // allreduce: compression asked for by the caller, as allreduceCompressed's (its residual is
  // host memory: the cross-node leg encodes the staged host copy); null: NANOCCL_COMPRESSION.
  std::shared_ptr<const CompressionRequest> compression;
};

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  // Connects to every peer through the store (rank 0 creates the job secret). Fails with a
  // clear Status within options.timeout if a peer never shows up.
  static Result<std::shared_ptr<Communicator>> create(const CommunicatorOptions& options);
  ~Communicator();

  int rank() const;
  int size() const;
  const Config& config() const;
  // Which ranks share a node; the same on every rank.
  const Topology& topology() const;
  // What the links and the CPU can do (collectives/tuning.h), agreed by every rank at
  // creation; null under NANOCCL_TUNING=off (unless compression is "auto") and on a one-rank
  // communicator.
  std::shared_ptr<const LinkProfile> linkProfile() const;
  // What the planner would run for a SUM allreduce of `count` elements of `dtype` (with this
  // communicator's settings: algo, compression; or, with `codec` non-empty, as
  // allreduceCompressed with that codec would) and the cost model's time for it: infinity
  // without a link profile, 0 on one rank. Local: nothing is sent. For tools that size
  // buckets (nanoccl.tune.ddp_bucket_cap_mb, nanoccl.hooks' fusion).
  struct Prediction {
    std::string algorithm;
    std::string codec;  // "none" when lossless
    size_t codecChunkBytes = 0;  // the compressed exchange's chunk (0 when lossless)
    double seconds = 0;
  };
  Result<Prediction> predictAllreduce(size_t count, DataType dtype,
                                      const std::string& codec = "") const;

  // In place on `buf` (count elements). kPremulSum multiplies this rank's input by
  // `premulFactor` first. kAvg divides the sum by size() (integer division for integers).
  std::shared_ptr<Task> allreduce(void* buf, size_t count, DataType dtype, ReduceOp op,
                                  double premulFactor = 1.0);
  // With config().compression set, a float32, float16 or bfloat16 kSum/kAvg/kPremulSum
  // allreduce or reduceScatter of at least compressionMinBytes between several nodes compresses
  // its inter-node leg: the result is then the same on every rank but lossy
  // (collectives/codec/codec.h gives the error per codec). float16/bfloat16 calls cross nodes
  // in float32 (encoded from float32, accumulated in float32, rounded back to the input type
  // once); the intra-node stages stay in the input type. Everything else, and everything
  // within a node, stays lossless.
  //
  // allreduce with compression asked for by this call, whatever its size and the config: the
  // same contract otherwise. The buffer must be float32, float16 or bfloat16 (the residual is
  // `count` floats either way) and the reduction kSum, kAvg or
  // kPremulSum (else kInvalidArgument). A single-node communicator runs it lossless (and leaves
  // the residual alone). Every rank must pass the same codec and block size.
  std::shared_ptr<Task> allreduceCompressed(void* buf, size_t count, DataType dtype, ReduceOp op,
                                            const CompressionRequest& compression,
                                            double premulFactor = 1.0);
  // The result lands in `buf` on `root`; other ranks' buffers are left unchanged.
  std::shared_ptr<Task> reduce(void* buf, size_t count, DataType dtype, ReduceOp op, int root,
                               double premulFactor = 1.0);
  std::shared_ptr<Task> broadcast(void* buf, size_t count, DataType dtype, int root);
  // `recv` holds recvCounts[r] elements from rank r, back to back in rank order.
  // recvCounts[rank()] must equal sendCount. `send` may alias the rank's slot in `recv`.
  std::shared_ptr<Task> allgather(const void* send, size_t sendCount, void* recv,
                                  const std::vector<size_t>& recvCounts, DataType dtype);
  // `send` holds counts[r] elements for rank r, back to back; `recv` gets counts[rank()]
  // elements: the reduction of every rank's part for this rank.
  std::shared_ptr<Task> reduceScatter(const void* send, void* recv,
                                      const std::vector<size_t>& counts, DataType dtype,
                                      ReduceOp op, double premulFactor = 1.0);
  // reduceScatter with compression asked for by this call, whatever its size and the config
  // (as allreduceCompressed: float32, float16 or bfloat16 with kSum, kAvg or kPremulSum, the
  // inter-node leg only; lossless on a single-node communicator, the residual untouched).
  // compression.residual: null, or sum(counts) floats of error feedback the caller keeps
  // between calls of the same counts (zeros at first; each rank's own, laid out as the
  // algorithm encodes, not as the input).
  std::shared_ptr<Task> reduceScatterCompressed(const void* send, void* recv,
                                                const std::vector<size_t>& counts,
                                                DataType dtype, ReduceOp op,
                                                const CompressionRequest& compression,
                                                double premulFactor = 1.0);
  // Rank r's part of `send` (sendCounts[r] elements, back to back) goes to rank r; `recv`
  // gets recvCounts[r] elements from rank r, back to back.
  std::shared_ptr<Task> alltoall(const void* send, const std::vector<size_t>& sendCounts,
                                 void* recv, const std::vector<size_t>& recvCounts, DataType dtype);
  // On root, `recv` gets recvCounts[r] elements from rank r, back to back (ignored elsewhere).
  std::shared_ptr<Task> gather(const void* send, size_t sendCount, void* recv,
                               const std::vector<size_t>& recvCounts, DataType dtype, int root);
  // From root's `send` (sendCounts[r] elements for rank r, back to back), rank r receives
  // sendCounts[r] == recvCount elements.
  std::shared_ptr<Task> scatter(const void* send, const std::vector<size_t>& sendCounts, void* recv,
                                size_t recvCount, DataType dtype, int root);
  std::shared_ptr<Task> send(const void* buf, size_t count, DataType dtype, int peer, uint32_t tag);
  // peer may be kAnySource; Task::source() tells who sent.
  std::shared_ptr<Task> recv(void* buf, size_t count, DataType dtype, int peer, uint32_t tag);
  std::shared_ptr<Task> barrier();
  // A collective on device memory (DeviceCall), queued and ordered with every other call. The
  // Task completes once its work is all queued on the device (Task::deviceEnd()); the caller
  // keeps the buffers until the device has passed that fence. Compression settings do not
  // apply (device calls are lossless). The communicator's watchdog fails the communicator, and
  // aborts the device, when a call's device work has not ended by the call's deadline.
  std::shared_ptr<Task> deviceCall(const DeviceCall& call);
  // Takes the place of a collective this rank refused before queueing it (an argument error
  // found locally, so no byte of it moved): a barrier that every rank refusing the same call
  // runs too, so that they stay in step and the communicator stays usable. A rank that queued
  // a real call there meets a mismatch naming this rank's refusal, and the communicator fails
  // on every rank within the timeout, as for any mismatch.
  std::shared_ptr<Task> refusedCall();

  // Starts the queued calls on the worker thread now. A lone call on an idle communicator is
  // otherwise left for a moment to its caller, who usually waits on it next and then runs it
  // itself (Task::runHere); a caller that will not wait on the Task (it waits on a future,
  // or polls test()) calls this. Without it such a call still starts, within 10 ms.
  void handOver();

  // Fails every pending and later Task with `why` and tells the peers. Idempotent.
  void abort(const Status& why);

  CommStats stats() const;

 private:
  struct Impl;
  explicit Communicator(std::unique_ptr<Impl> impl);
  // reduceScatter and reduceScatterCompressed (request null: the config's compression).
  std::shared_ptr<Task> reduceScatterWith(const void* send, void* recv,
                                          const std::vector<size_t>& counts, DataType dtype,
                                          ReduceOp op, double premulFactor,
                                          const CompressionRequest* request);
  // allreduce and allreduceCompressed (request null: the config's compression, if any).
  std::shared_ptr<Task> allreduceWith(void* buf, size_t count, DataType dtype, ReduceOp op,
                                      double premulFactor, const CompressionRequest* request);
  friend class Task;       // runHere()
  friend class CallScope;  // close()
  void closeScope(const CallScope* scope);
  // Task::runHere(): runs `task`'s call here if it is next, nothing runs and the call's
  // deadline is not later than `waiter`; hands it to the worker where only the deadline
  // stands in the way.
  void runIfNext(const Task& task, const Deadline& waiter);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nanoccl
