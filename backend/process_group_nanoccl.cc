#include "backend/process_group_nanoccl.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <limits>
#include <utility>

#include "backend/c10d_store.h"
#include "backend/cuda_work.h"
#include "backend/pg_internal.h"
#include "collectives/codec/codec.h"
#include "collectives/communicator.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/op.h"
#include "common/status.h"

namespace nanoccl {

using namespace pg;  // NOLINT: this file is pg_internal.h's user

// ---- Options ---------------------------------------------------------------------------------

ProcessGroupNanoccl::Options::Options(std::chrono::milliseconds timeout)
    : c10d::Backend::Options(kBackendName, timeout) {}

c10::intrusive_ptr<ProcessGroupNanoccl::Options> ProcessGroupNanoccl::Options::create(
    std::chrono::milliseconds timeout) {
  return c10::make_intrusive<Options>(timeout);
}

// ---- construction ----------------------------------------------------------------------------

ProcessGroupNanoccl::ProcessGroupNanoccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, c10::intrusive_ptr<Options> options)
    : c10d::Backend(rank, size), options_(std::move(options)) {
  if (!store) pg::raise(pg::ErrorKind::kValue, "nanoccl: no store");
  if (!options_) pg::raise(pg::ErrorKind::kValue, "nanoccl: no options");
  if (size < 1 || rank < 0 || rank >= size) {
    pg::raise(pg::ErrorKind::kValue, "nanoccl: rank " + std::to_string(rank) +
                                         " is outside a group of size " + std::to_string(size));
  }
  if (options_->timeout.count() <= 0) {
    pg::raise(pg::ErrorKind::kValue, "nanoccl: the timeout must be positive");
  }
  init();
  groupName_ = options_->groupName.empty() ? "default" : options_->groupName;
  const std::string who = rankLabel(rank, size) + " of group '" + groupName_ + "'";

  auto config = Config::fromEnv();
  if (!config.isOk()) pg::raise(config.status(), "nanoccl: ");
  for (const auto& [name, value] : options_->settings) {
    if (const Status s = config->set(name, value); !s.isOk()) pg::raise(s, "nanoccl: ");
  }
  config->logOnce();

  auto cstore = std::make_shared<C10dStore>(store);
  // torch gives each group its own PrefixStore; the creation counter also keeps apart several
  // communicators made on one store (a C++ user reusing a store, a group re-created after
  // destroy_process_group). Every rank creates the group's communicators in the same order, so
  // the size-th increments of the counter belong to one creation.
  auto n = cstore->add("nanoccl/creations", 1);
  if (!n.isOk()) pg::raise(pg::ErrorKind::kBackend, "nanoccl " + who + ": rendezvous failed: " +
                                                      n.status().toString());
  commId_ = groupName_ + "." + std::to_string((n.value() - 1) / size);

  CommunicatorOptions copts;
  copts.rank = rank;
  copts.size = size;
  copts.store = cstore;
  store_ = cstore;
  copts.commId = commId_;
  copts.config = config.value();
  copts.timeout = options_->timeout;
  copts.nodeId = torchNodeId();
  auto comm = Communicator::create(copts);
  if (!comm.isOk()) pg::raise(comm.status(), "nanoccl " + who + ": creating the communicator failed: ");
  comm_ = std::move(comm).value();
  nodes_ = comm_->topology().nodeIds;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupNanoccl::create(
    const c10d::DistributedBackendOptions& dist, c10::intrusive_ptr<Options> options) {
  if (!options) options = Options::create();
  options->timeout = std::chrono::duration_cast<std::chrono::milliseconds>(dist.timeout);
  options->groupName = dist.group_id;
  options->globalRanks = dist.global_ranks_in_group;
  return c10::make_intrusive<ProcessGroupNanoccl>(dist.store, dist.group_rank, dist.group_size,
                                                  std::move(options));
}

ProcessGroupNanoccl::~ProcessGroupNanoccl() {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CudaCollectives> cuda;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm = std::move(comm_);
    cuda = std::move(cuda_);
    pending_.clear();
  }
  // The destructors fail what is pending and join their threads.
  cuda.reset();
  comm.reset();
}

// ---- lifecycle ------------------------------------------------------------------------------

std::shared_ptr<Communicator> ProcessGroupNanoccl::live(const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!comm_) {
    pg::raise(pg::ErrorKind::kBackend, "nanoccl " + rankLabel(rank_, size_) + " of group '" +
                                           groupName_ + "': " + what +
                                           " after the process group was " +
                                           (closedReason_.empty() ? "shut down" : closedReason_));
  }
  return comm_;
}

uint64_t ProcessGroupNanoccl::getSequenceNumberForGroup() {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

void ProcessGroupNanoccl::abort() {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CudaCollectives> cuda;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm = std::move(comm_);
    cuda = std::move(cuda_);
    closedReason_ = "aborted";
    pending_.clear();
  }
  const Status why = abortedError("rank " + std::to_string(rank_) + " aborted the process group");
  if (cuda) cuda->abort(why);
  if (comm) comm->abort(why);
  cuda.reset();
  comm.reset();
}

void ProcessGroupNanoccl::shutdown() {
  std::vector<c10::weak_intrusive_ptr<c10d::Work>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!comm_) return;
    pending = std::move(pending_);
  }
  // Let what was issued finish first, so that peers still receiving from this rank are not
  // cut off; every Work completes within the timeout of its issue, so this is bounded by the
  // timeout (backend/work_deadline.h).
  const auto deadline = std::chrono::steady_clock::now() + options_->timeout;
  for (auto& weak : pending) {
    if (auto work = weak.lock()) {
      try {
        work->wait();
      } catch (const std::exception&) {
        // Its error belongs to whoever waits on it; shutting down goes on.
      }
    }
  }
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CudaCollectives> cuda;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm = std::move(comm_);
    cuda = std::move(cuda_);
    closedReason_ = "shut down";
  }
  // CUDA calls whose Work was waited on may still run on the GPU: let them end first.
  if (cuda) cuda->shutdown(Deadline(deadline));
  cuda.reset();
  comm.reset();
}

// ---- stats ----------------------------------------------------------------------------------


std::shared_ptr<const LinkProfile> ProcessGroupNanoccl::linkProfile() const {
  std::lock_guard<std::mutex> lock(mu_);
  return comm_ ? comm_->linkProfile() : nullptr;
}

std::tuple<std::string, std::string, double, int64_t> ProcessGroupNanoccl::predictAllreduce(
    int64_t count, at::ScalarType dtype, const std::string& codec) const {
  const std::optional<DataType> t = pg::mapType(dtype);
  if (!t) {
    pg::raise(pg::ErrorKind::kType,
              "nanoccl: no allreduce of " + std::string(c10::toString(dtype)));
  }
  if (count < 0) pg::raise(pg::ErrorKind::kValue, "nanoccl: a negative element count");
  std::shared_ptr<Communicator> comm = live("predict_allreduce");
  Result<Communicator::Prediction> p =
      comm->predictAllreduce(static_cast<size_t>(count), *t, codec);
  if (!p.isOk()) pg::raise(pg::ErrorKind::kValue, "nanoccl: " + p.status().message());
  return {p.value().algorithm, p.value().codec, p.value().seconds,
          static_cast<int64_t>(p.value().codecChunkBytes)};
}

CommStats ProcessGroupNanoccl::stats() const {
  std::shared_ptr<Communicator> comm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm = comm_;
  }
  if (comm) return comm->stats();
  CommStats out;
  out.rank = rank_;
  out.size = size_;
  out.nodes = nodes_;
  return out;
}

// ---- calls ----------------------------------------------------------------------------------

std::shared_ptr<CudaCollectives> ProcessGroupNanoccl::cuda(const CommPtr& comm,
                                                           const at::Tensor& t,
                                                           const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cuda_) return cuda_;
  auto created = CudaCollectives::create(comm, t.device(), options_->timeout);
  if (!created.isOk()) reject(std::string(what) + ": " + created.status().message());
  cuda_ = std::move(created).value();
  return cuda_;
}


c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  return run("broadcast", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    if (tensors.size() == 1 && onCuda(tensors[0])) {
      const int root = checkRoot(opts.rootRank, size_, "broadcast");
      if (opts.rootTensor != 0) reject("broadcast: rootTensor must be 0");
      return cudaWork(cuda(owner, tensors[0], "broadcast")->broadcast(tensors[0], root), rank_,
                      size_);
    }
    checkOne(tensors, "broadcast");
    const int root = checkRoot(opts.rootRank, size_, "broadcast");
    if (opts.rootTensor != 0) reject("broadcast: rootTensor must be 0");
    auto work = NANOCCL_WORK(c10d::OpType::BROADCAST, "broadcast", tensors);
    const Wire w = moveType(tensors[0]);
    at::Tensor buf = output(*work, tensors[0], /*keep=*/true);
    WorkNanoccl::start(work,
                       {[&] { return comm.broadcast(ptr(buf), count(buf, w), w.dtype, root); }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  return run("allreduce", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    if (tensors.size() == 1 && onCuda(tensors[0])) {
      const DataType dt = reduceType(tensors[0], "allreduce");
      const Reduction red = mapReduction(opts.reduceOp, dt, "allreduce");
      return cudaWork(
          cuda(owner, tensors[0], "allreduce")->allreduce(tensors[0], dt, red.op, red.factor),
          rank_, size_);
    }
    checkOne(tensors, "allreduce");
    const DataType dt = reduceType(tensors[0], "allreduce");
    const Reduction red = mapReduction(opts.reduceOp, dt, "allreduce");
    auto work = NANOCCL_WORK(c10d::OpType::ALLREDUCE, "allreduce", tensors);
    at::Tensor buf = output(*work, tensors[0], true);
    WorkNanoccl::start(work, {[&] {
                         return comm.allreduce(ptr(buf), static_cast<size_t>(buf.numel()), dt,
                                               red.op, red.factor);
                       }});
    return work;
  });
}

namespace {

// An error-feedback residual for `data` (undefined: none): float32, contiguous, as many
// elements, its own memory; else the call is rejected.
void checkResidual(const at::Tensor& residual, const at::Tensor& data, const char* what) {
  if (!residual.defined()) return;
  checkTensor(residual, what);
  if (residual.scalar_type() != at::kFloat || !residual.is_contiguous() ||
      residual.numel() != data.numel()) {
    reject(std::string(what) + ": the residual must be a contiguous float32 tensor of " +
           std::to_string(data.numel()) + " elements, got " +
           std::string(c10::toString(residual.scalar_type())) + " x " +
           std::to_string(residual.numel()));
  }
  if (residual.data_ptr() == data.data_ptr()) {
    reject(std::string(what) + ": the residual must not share memory with the tensor");
  }
}

// A *_compressed call's block_size, which travels as a uint32, or the call is rejected.
void checkBlockSize(int64_t blockSize, const char* what) {
  if (blockSize < 0 || blockSize > std::numeric_limits<uint32_t>::max()) {
    reject(std::string(what) + ": block_size " + std::to_string(blockSize) + " out of range");
  }
}

// The codec a *_compressed call names, with its block size, or the call is rejected.
std::pair<const codec::Codec*, codec::CodecParams> requestedCodec(const Communicator& comm,
                                                                  const std::string& name,
                                                                  int64_t blockSize,
                                                                  const char* what) {
  checkBlockSize(blockSize, what);
  Result<const codec::Codec*> found = codec::findCodec(name);
  if (!found.isOk()) reject(std::string(what) + ": " + found.status().message());
  codec::CodecParams params;
  params.blockSize = blockSize != 0 ? static_cast<uint32_t>(blockSize)
                                    : static_cast<uint32_t>(comm.config().compressionBlock);
  Result<uint32_t> block = codec::resolveBlockSize(*found.value(), params);
  if (!block.isOk()) reject(std::string(what) + ": " + block.status().message());
  return {found.value(), params};
}

void checkFloatTensor(const at::Tensor& t, const char* what) {
  checkTensor(t, what);
  const at::ScalarType st = t.scalar_type();
  if (st != at::kFloat && st != at::kHalf && st != at::kBFloat16) {
    rejectType(std::string(what) + ": takes float32, float16 or bfloat16 tensors, got " +
               std::string(c10::toString(st)));
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allreduceCompressed(
    at::Tensor& tensor, at::Tensor& residual, const std::string& codec, int64_t blockSize,
    const c10d::ReduceOp& op) {
  return run("allreduce_compressed", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    const char* what = "allreduce_compressed";
    if (onCuda(tensor)) {  // the residual in host memory: the host encodes the staged copy
      const DataType dt = reduceType(tensor, what);
      checkBlockSize(blockSize, what);
      checkResidual(residual, tensor,
                    "allreduce_compressed: the residual (host memory, also for a CUDA tensor)");
      const Reduction red = mapReduction(op, dt, what);
      auto request = std::make_shared<CompressionRequest>();
      request->codec = codec;
      request->blockSize = static_cast<uint32_t>(blockSize);
      return cudaWork(cuda(owner, tensor, what)
                          ->allreduceCompressed(tensor, residual, std::move(request), dt, red.op,
                                                red.factor),
                      rank_, size_);
    }
    checkFloatTensor(tensor, what);
    const DataType dt = reduceType(tensor, what);
    checkResidual(residual, tensor, what);
    checkBlockSize(blockSize, what);
    const Reduction red = mapReduction(op, dt, what);
    std::vector<at::Tensor> tensors{tensor};
    auto work = NANOCCL_WORK(c10d::OpType::ALLREDUCE, what, tensors);
    at::Tensor buf = output(*work, tensor, true);
    CompressionRequest request;
    request.codec = codec;
    request.blockSize = static_cast<uint32_t>(blockSize);
    if (residual.defined()) {
      work->hold(residual);
      request.residual = residual.data_ptr<float>();
    }
    WorkNanoccl::start(work, {[&] {
                         return comm.allreduceCompressed(ptr(buf),
                                                         static_cast<size_t>(buf.numel()),
                                                         dt, red.op, request,
                                                         red.factor);
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::reduceScatterCompressed(
    at::Tensor& output, at::Tensor& input, at::Tensor& residual, const std::string& codec,
    int64_t blockSize, const c10d::ReduceOp& op) {
  return run("reduce_scatter_compressed", true, [&](Communicator& comm, const CommPtr& owner) {
    const char* what = "reduce_scatter_compressed";
    checkFloatTensor(input, what);
    checkFloatTensor(output, what);
    checkResidual(residual, input, what);
    requestedCodec(comm, codec, blockSize, what);  // a clear rejection here, before queueing
    CompressionRequest request;
    request.codec = codec;
    request.blockSize = static_cast<uint32_t>(blockSize);
    auto work = NANOCCL_WORK(c10d::OpType::_REDUCE_SCATTER_BASE, what, {output});
    if (residual.defined()) {
      work->hold(residual);
      request.residual = residual.data_ptr<float>();
    }
    WorkNanoccl::start(
        work, {reduceScatterFlat(comm, *work, output, input, op, size_, what, &request)});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allgatherCompressed(
    at::Tensor& output, at::Tensor& input, const std::string& codecName, int64_t blockSize) {
  return run("allgather_compressed", true, [&](Communicator& comm, const CommPtr& owner) {
    const char* what = "allgather_compressed";
    checkFloatTensor(input, what);
    checkFloatTensor(output, what);
    checkSameType(input, output, what);
    if (output.numel() != input.numel() * size_) {
      reject(std::string(what) + ": output has " + std::to_string(output.numel()) +
             " elements, expected " + std::to_string(size_) + " x " +
             std::to_string(input.numel()));
    }
    const auto [codec, params] = requestedCodec(comm, codecName, blockSize, what);
    auto work = NANOCCL_WORK(c10d::OpType::_ALLGATHER_BASE, what, {output});
    if (comm.topology().numNodes() < 2 || codec->id == codec::CodecId::kNone) {
      WorkNanoccl::start(work, {allgatherFlat(comm, *work, output, input, size_, what)});
      return work;
    }
    const DataType dt = reduceType(input, what);
    const at::Tensor in = input.contiguous();
    const size_t n = static_cast<size_t>(in.numel());
    const size_t bytes = codec->encodedBytes(n, params);
    const auto byteOptions = at::TensorOptions().dtype(at::kByte);
    at::Tensor encoded = at::empty({static_cast<int64_t>(bytes)}, byteOptions);
    at::Tensor gathered = at::empty({static_cast<int64_t>(bytes) * size_}, byteOptions);
    // Encoded here, on the caller's thread, once: what this rank's part becomes on every rank.
    if (Status st = codec->encode(ptr(in), dt, n, params, encoded.data_ptr(), bytes);
        !st.isOk()) {
      reject(std::string(what) + ": " + st.message());
    }
    work->hold(encoded);
    // Every part decoded into a contiguous float32 buffer (the output itself when it is one),
    // then copied into the output where it is not.
    const bool direct = output.is_contiguous() && dt == DataType::kFloat32;
    at::Tensor out = direct ? output : at::empty(output.sizes(), byteOptions.dtype(at::kFloat));
    const int parts = size_;
    work->atSuccess([output, out, gathered, codec, n, bytes, parts, direct]() mutable {
      auto* dst = static_cast<float*>(out.data_ptr());
      const auto* src = static_cast<const char*>(gathered.data_ptr());
      for (int r = 0; r < parts; ++r) {
        Status st = codec->decode(src + static_cast<size_t>(r) * bytes, bytes,
                                  dst + static_cast<size_t>(r) * n, n);
        if (!st.isOk()) {
          throw std::runtime_error("rank " + std::to_string(r) + "'s part: " + st.message() +
                                   " (did every rank pass the same codec and block size?)");
        }
      }
      if (!direct) output.copy_(out);  // rounded to the output's type here
    });
    std::vector<size_t> counts(static_cast<size_t>(size_), bytes);
    WorkNanoccl::start(work, {[&comm, encoded, gathered, bytes, counts] {
                         return comm.allgather(ptr(encoded), bytes, ptr(gathered), counts,
                                               DataType::kUInt8);
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return run("allreduce_coalesced", true, [&](Communicator& comm, const CommPtr& owner) {
    if (tensors.empty()) reject("allreduce_coalesced: no tensors");
    for (const auto& t : tensors) {
      checkTensor(t, "allreduce_coalesced");
      checkSameType(tensors[0], t, "allreduce_coalesced");
    }
    const DataType dt = reduceType(tensors[0], "allreduce_coalesced");
    const Reduction red = mapReduction(opts.reduceOp, dt, "allreduce_coalesced");
    auto work = NANOCCL_WORK(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors);
    // One call on the tensors back to back: one message per step instead of one per tensor.
    at::Tensor flat = concatInput(*work, tensors);
    work->atSuccess([outs = tensors, flat]() mutable {
      int64_t off = 0;
      for (auto& o : outs) {
        const int64_t n = o.numel();
        o.copy_(flat.narrow(0, off, n).view(o.sizes()));
        off += n;
      }
    });
    for (const auto& t : tensors) work->hold(t);
    WorkNanoccl::start(work, {[&] {
                         return comm.allreduce(ptr(flat), static_cast<size_t>(flat.numel()), dt,
                                               red.op, red.factor);
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::reduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::ReduceOptions& opts) {
  return run("reduce", true, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(tensors, "reduce");
    const int root = checkRoot(opts.rootRank, size_, "reduce");
    if (opts.rootTensor != 0) reject("reduce: rootTensor must be 0");
    const DataType dt = reduceType(tensors[0], "reduce");
    const Reduction red = mapReduction(opts.reduceOp, dt, "reduce");
    auto work = NANOCCL_WORK(c10d::OpType::REDUCE, "reduce", tensors);
    at::Tensor buf = output(*work, tensors[0], true);
    WorkNanoccl::start(work, {[&] {
                         return comm.reduce(ptr(buf), static_cast<size_t>(buf.numel()), dt, red.op,
                                            root, red.factor);
                       }});
    return work;
  });
}


c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return run("allgather", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    if (inputs.size() == 1 && onCuda(inputs[0])) {
      if (outputs.size() != 1) reject("allgather: takes one output list per rank");
      return cudaWork(cuda(owner, inputs[0], "allgather")->allgather(outputs[0], inputs[0]), rank_,
                      size_);
    }
    checkOne(inputs, "allgather");
    if (outputs.size() != 1) reject("allgather: takes one output list per rank");
    auto work = NANOCCL_WORK(c10d::OpType::ALLGATHER, "allgather", outputs[0]);
    WorkNanoccl::start(
        work, {allgatherInto(comm, *work, inputs[0], outputs[0], rank_, size_, "allgather")});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return run("_allgather_base", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    if (onCuda(input) || onCuda(output)) {
      const at::Tensor& any = onCuda(input) ? input : output;
      return cudaWork(cuda(owner, any, "_allgather_base")->allgatherBase(output, input), rank_,
                      size_);
    }
    auto work = NANOCCL_WORK(c10d::OpType::_ALLGATHER_BASE, "_allgather_base", {output});
    WorkNanoccl::start(work, {allgatherFlat(comm, *work, output, input, size_, "_allgather_base")});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return run("allgather_coalesced", true, [&](Communicator& comm, const CommPtr& owner) {
    if (outputLists.size() != static_cast<size_t>(size_)) {
      reject("allgather_coalesced: expected " + std::to_string(size_) +
             " output lists (one per rank), got " + std::to_string(outputLists.size()));
    }
    std::vector<at::Tensor> flatOutputs;
    for (const auto& list : outputLists) {
      if (list.size() != inputs.size()) {
        reject("allgather_coalesced: each output list needs one tensor per input (" +
               std::to_string(inputs.size()) + "), got " + std::to_string(list.size()));
      }
      flatOutputs.insert(flatOutputs.end(), list.begin(), list.end());
    }
    auto work = NANOCCL_WORK(c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", flatOutputs);
    std::vector<Queue> tasks;
    // outputLists[r][i] is input i of rank r.
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<at::Tensor> outs;
      for (int r = 0; r < size_; ++r) outs.push_back(outputLists[r][i]);
      tasks.push_back(
          allgatherInto(comm, *work, inputs[i], outs, rank_, size_, "allgather_coalesced"));
    }
    WorkNanoccl::start(work, std::move(tasks));
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return run("allgather_into_tensor_coalesced", true,
             [&](Communicator& comm, const CommPtr& owner) {
               if (outputs.size() != inputs.size()) {
                 reject("allgather_into_tensor_coalesced: " + std::to_string(outputs.size()) +
                        " outputs for " + std::to_string(inputs.size()) + " inputs");
               }
               auto work = NANOCCL_WORK(c10d::OpType::ALLGATHER_COALESCED,
                                        "allgather_into_tensor_coalesced", outputs);
               std::vector<Queue> tasks;
               for (size_t i = 0; i < inputs.size(); ++i) {
                 tasks.push_back(allgatherFlat(comm, *work, outputs[i], inputs[i], size_,
                                               "allgather_into_tensor_coalesced"));
               }
               WorkNanoccl::start(work, std::move(tasks));
               return work;
             });
}

}  // namespace nanoccl
