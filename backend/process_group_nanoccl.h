// ProcessGroupNanoccl: nanoccl as a c10d::Backend, for torch.distributed and for libtorch C++.
//
// From Python, `import nanoccl` registers it as the backend "nanoccl" (devices cpu and cuda).
// From C++ (see examples/):
//
//   auto store = c10::make_intrusive<c10d::FileStore>("/tmp/rdzv", size);
//   auto opts = nanoccl::ProcessGroupNanoccl::Options::create(std::chrono::seconds(30));
//   opts->settings["nsocks"] = "4";
//   auto pg = c10::make_intrusive<nanoccl::ProcessGroupNanoccl>(store, rank, size, opts);
//   std::vector<at::Tensor> t = {at::ones({1024})};
//   pg->allreduce(t)->wait();
//
// Contract
// - Every rank calls the collectives in the same order with matching arguments (as with Gloo).
//   A mismatch (shape, dtype, root, op) fails the call on every rank with a RuntimeError that
//   names both ranks, within the timeout; the group is unusable after it, as in NCCL. A call
//   this rank rejects before any byte of it moves (bad root, bad dtype, a sparse tensor...)
//   throws here and leaves a refused call in its place (Communicator::refusedCall): where every
//   rank refused the same call the group stays usable, as Gloo's does; a rank that made the
//   call instead meets a mismatch naming the refusing rank at once, not at the timeout.
// - Options::timeout (torch's init_process_group / new_group timeout) is every call's
//   deadline, counted from when the call was issued (not from when it ran or was waited on):
//   each Work completes, successfully or with an exception, within it. Work::wait(timeout)
//   counts from the issue too (backend/work_deadline.h says it all in one place).
// - Tensors are dense CPU tensors of any dtype (reductions: the nanoccl::DataType set).
//   Non-contiguous tensors go through a contiguous copy.
// - CUDA tensors (builds with CUDA and NCCL): allreduce, broadcast, allgather, reduce_scatter
//   and their _base forms, on one device per rank (that of the first CUDA call), with
//   ProcessGroupNCCL's stream semantics: NCCL inside a node, pinned-memory staging across nodes
//   (backend/cuda_work.h; collectives/device/). In-place and flat output tensors must be
//   contiguous; reductions take float32/64, float16, bfloat16, int8, uint8, int32 and int64
//   with sum, product, min, max, avg or premul_sum (floating point). Other calls raise.
// - Tensors passed to a call must stay untouched until its Work completes; the Work keeps them
//   alive. Work::getFuture() completes with the output tensors (a list) or the error.
//
// Threads: calls may come from any thread (one at a time defines the order, as in torch).
// A Work is marked done by the thread that ran its call (the communicator's worker, or the
// caller that waited on it), then its future. A future's callbacks are user code that may
// issue and wait on more calls (PyTorch's PowerSGD hook does): they never run on a thread that
// runs calls, but on the callback runner (common/callback_runner.h), in a CallScope
// (collectives/communicator.h) that gives the calls they issue the same place in the order on
// every rank: right after the call whose future it is, as if the callbacks had run inline.
// CUDA calls' futures complete on the callback runner too, once the call is enqueued on its
// stream.
// shutdown() (destroy_process_group) and the destructor stop every thread and close every
// socket of the group; later calls throw.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "collectives/communicator.h"

namespace nanoccl {

class CudaCollectives;

class ProcessGroupNanoccl : public c10d::Backend {
 public:
  static constexpr const char* kBackendName = "nanoccl";

  struct Options : c10d::Backend::Options {
    explicit Options(std::chrono::milliseconds timeout = kBackendDefaultTimeout);
    static c10::intrusive_ptr<Options> create(
        std::chrono::milliseconds timeout = kBackendDefaultTimeout);

    // nanoccl settings by their Options/environment name ("nsocks" or "NANOCCL_NSOCKS" -> "4"),
    // applied over the NANOCCL_* environment; see common/config.cc for the list. The
    // timeout above, not "timeout_ms", is the deadline of every call.
    std::map<std::string, std::string> settings;
    // torch's group name (for messages and the communicator id) and the group's members'
    // global ranks. Fields of our own: c10d::Backend::Options only gained equivalents in
    // recent torch versions, and this builds against torch >= 2.11.
    std::string groupName;
    std::vector<int64_t> globalRanks;
  };

  // Connects to every rank of the group through `store` (blocking, bounded by
  // options->timeout). Throws a c10::DistBackendError naming the ranks on failure.
  ProcessGroupNanoccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      c10::intrusive_ptr<Options> options = Options::create());
  ~ProcessGroupNanoccl() override;

  // torch's extended creator signature (Backend.register_backend(extended_api=True)).
  static c10::intrusive_ptr<c10d::Backend> create(const c10d::DistributedBackendOptions& dist,
                                                  c10::intrusive_ptr<Options> options);

  const std::string getBackendName() const override { return kBackendName; }
  const c10::intrusive_ptr<Options>& options() const { return options_; }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  // allreduce with its inter-node leg compressed by `codec` (nanoccl.allreduce_compressed),
  // whatever NANOCCL_COMPRESSION says: float32, SUM or AVG. `residual` is the caller's error
  // feedback (float32, as many elements as `tensor`, contiguous, kept between calls) or an
  // undefined tensor. blockSize 0: the group's compression_block, else the codec's default.
  c10::intrusive_ptr<c10d::Work> allreduceCompressed(at::Tensor& tensor, at::Tensor& residual,
                                                     const std::string& codec, int64_t blockSize,
                                                     const c10d::ReduceOp& op);
  // _reduce_scatter_base with its inter-node leg compressed by `codec`
  // (nanoccl.reduce_scatter_compressed), whatever the size and NANOCCL_COMPRESSION say:
  // float32, float16 or bfloat16 with SUM, AVG or PREMUL_SUM (FSDP2's reductions); lossless on
  // a group within one node. `residual`: error feedback (float32, as many elements as `input`,
  // contiguous, kept between calls of this size) or an undefined tensor.
  c10::intrusive_ptr<c10d::Work> reduceScatterCompressed(at::Tensor& output, at::Tensor& input,
                                                         at::Tensor& residual,
                                                         const std::string& codec,
                                                         int64_t blockSize,
                                                         const c10d::ReduceOp& op);
  // _allgather_base of a float32, float16 or bfloat16 `input` quantized by `codec` (ZeRO++'s
  // qwZ: FSDP's parameters crossing nodes as int8, the sharded master copy untouched). Each
  // rank encodes its own input once, the encoded bytes are gathered, and every rank (the owner
  // too) decodes every part, so all ranks end with the same bits. A group within one node, or
  // codec "none", gathers losslessly.
  c10::intrusive_ptr<c10d::Work> allgatherCompressed(at::Tensor& output, at::Tensor& input,
                                                     const std::string& codec, int64_t blockSize);
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override;

  // Fails every pending Work of this rank and tells the peers; the group is unusable after.
  void abort() override;
  // Lets pending Works finish (bounded by the timeout), then destroys the communicator:
  // no thread or socket of the group is left. Idempotent.
  void shutdown() override;

  // What this rank moved in the group (nanoccl.stats()); rank, size and nodes only once the
  // group is shut down.
  CommStats stats() const;
  // The link profile the group's communicator agreed on at creation (collectives/tuning.h);
  // null under NANOCCL_TUNING=off, on one rank, and once shut down.
  std::shared_ptr<const LinkProfile> linkProfile() const;
  // Communicator::predictAllreduce for `count` elements of a torch dtype (and `codec`, empty:
  // the group's setting): (algorithm, codec, seconds, chunk bytes of the compressed exchange,
  // 0 when lossless). Throws ValueError-style c10::Error for a dtype nanoccl does not reduce or
  // an unknown codec.
  std::tuple<std::string, std::string, double, int64_t> predictAllreduce(
      int64_t count, at::ScalarType dtype, const std::string& codec = "") const;
  // The communicator's id in the store (distinct per group and per creation).
  const std::string& commId() const { return commId_; }

 private:
  // The live communicator, or a throw naming `what` once shut down.
  std::shared_ptr<Communicator> live(const char* what) const;
  // The group's CUDA side (backend/cuda_work.h) over `comm`, created at the first CUDA call on
  // the device of `t`; rejects the call (naming `what`) where there is none.
  std::shared_ptr<CudaCollectives> cuda(const std::shared_ptr<Communicator>& comm,
                                        const at::Tensor& t, const char* what);
  template <typename Fn>
  c10::intrusive_ptr<c10d::Work> run(const char* what, bool collective, Fn&& fn);

  c10::intrusive_ptr<Options> options_;
  std::string groupName_;
  std::string commId_;
  std::vector<std::string> nodes_;  // node id per rank (the communicator's topology)

  std::shared_ptr<Store> store_;  // the rendezvous (the CUDA side's communicators use it too)

  mutable std::mutex mu_;
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<CudaCollectives> cuda_;
  std::string closedReason_;
  uint64_t seq_ = 0;
  // The last collective and the point-to-point calls not known to be done: shutdown() waits
  // for them.
  std::vector<c10::weak_intrusive_ptr<c10d::Work>> pending_;
};

}  // namespace nanoccl
