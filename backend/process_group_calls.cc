// ProcessGroupNanoccl's gather, scatter, reduce_scatter, all_to_all, send/recv and barrier
// (process_group_nanoccl.cc has construction, lifecycle, stats, broadcast, the allreduces,
// reduce and the allgathers). Each checks its tensors on the calling thread, then queues its
// communicator call(s) through run(); see process_group_nanoccl.h for the contract.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "backend/pg_internal.h"
#include "backend/process_group_nanoccl.h"

namespace nanoccl {

using namespace pg;  // NOLINT: this file is pg_internal.h's user

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return run("gather", true, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(inputs, "gather");
    const int root = checkRoot(opts.rootRank, size_, "gather");
    const at::Tensor& in = inputs[0];
    const Wire w = moveType(in);
    std::vector<at::Tensor> outs;
    if (rank_ == root) {
      if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_) {
        reject("gather: the root needs one output list of " + std::to_string(size_) + " tensors");
      }
      outs = outputs[0];
      for (const auto& o : outs) {
        checkTensor(o, "gather");
        checkSameType(in, o, "gather");
      }
      if (outs[rank_].numel() != in.numel()) {
        reject("gather: the root's output for itself has " + std::to_string(outs[rank_].numel()) +
               " elements, its input " + std::to_string(in.numel()));
      }
    } else if (!outputs.empty() && !(outputs.size() == 1 && outputs[0].empty())) {
      reject("gather: only the root (rank " + std::to_string(root) + ") takes output tensors");
    }
    auto work = NANOCCL_WORK(c10d::OpType::GATHER, "gather", outs);
    at::Tensor send = input(*work, in);
    std::vector<size_t> counts;
    void* recv = nullptr;
    if (rank_ == root) {
      at::Tensor flat = gatherBuffer(*work, outs, in.options());
      recv = ptr(flat);
      for (const auto& o : outs) counts.push_back(count(o, w));
    } else {
      counts.assign(static_cast<size_t>(size_), count(send, w));
    }
    WorkNanoccl::start(work, {[&] {
                         return comm.gather(ptr(send), count(send, w), recv, counts, w.dtype, root);
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return run("scatter", true, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(outputs, "scatter");
    const int root = checkRoot(opts.rootRank, size_, "scatter");
    const at::Tensor& out = outputs[0];
    const Wire w = moveType(out);
    auto work = NANOCCL_WORK(c10d::OpType::SCATTER, "scatter", outputs);
    std::vector<size_t> counts;
    const void* send = nullptr;
    if (rank_ == root) {
      if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_) {
        reject("scatter: the root needs one input list of " + std::to_string(size_) + " tensors");
      }
      for (const auto& t : inputs[0]) {
        checkTensor(t, "scatter");
        checkSameType(out, t, "scatter");
        counts.push_back(count(t, w));
      }
      if (inputs[0][rank_].numel() != out.numel()) {
        reject("scatter: the root's input for itself has " +
               std::to_string(inputs[0][rank_].numel()) + " elements, its output " +
               std::to_string(out.numel()));
      }
      send = ptr(concatInput(*work, inputs[0]));
    } else {
      if (!inputs.empty() && !(inputs.size() == 1 && inputs[0].empty())) {
        reject("scatter: only the root (rank " + std::to_string(root) + ") takes input tensors");
      }
      counts.assign(static_cast<size_t>(size_), count(out, w));
    }
    at::Tensor recv = output(*work, out, false);
    WorkNanoccl::start(
        work,
        {[&] { return comm.scatter(send, counts, ptr(recv), count(recv, w), w.dtype, root); }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return run("reduce_scatter", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    if (outputs.size() == 1 && onCuda(outputs[0])) {
      if (inputs.size() != 1) reject("reduce_scatter: needs one input list");
      const DataType dt = reduceType(outputs[0], "reduce_scatter");
      const Reduction red = mapReduction(opts.reduceOp, dt, "reduce_scatter");
      return cudaWork(cuda(owner, outputs[0], "reduce_scatter")
                          ->reduceScatter(outputs[0], inputs[0], dt, red.op, red.factor),
                      rank_, size_);
    }
    checkOne(outputs, "reduce_scatter");
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_) {
      reject("reduce_scatter: needs one input list of " + std::to_string(size_) + " tensors");
    }
    const at::Tensor& out = outputs[0];
    std::vector<size_t> counts;
    for (const auto& t : inputs[0]) {
      checkTensor(t, "reduce_scatter");
      checkSameType(out, t, "reduce_scatter");
      counts.push_back(static_cast<size_t>(t.numel()));
    }
    if (inputs[0][rank_].numel() != out.numel()) {
      reject("reduce_scatter: this rank's input part has " +
             std::to_string(inputs[0][rank_].numel()) + " elements, its output " +
             std::to_string(out.numel()));
    }
    const DataType dt = reduceType(out, "reduce_scatter");
    const Reduction red = mapReduction(opts.reduceOp, dt, "reduce_scatter");
    auto work = NANOCCL_WORK(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", outputs);
    at::Tensor send = concatInput(*work, inputs[0]);
    at::Tensor recv = output(*work, out, false);
    WorkNanoccl::start(
        work,
        {[&] { return comm.reduceScatter(ptr(send), ptr(recv), counts, dt, red.op, red.factor); }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return run(
      "_reduce_scatter_base", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
        if (onCuda(input) || onCuda(output)) {
          const at::Tensor& any = onCuda(input) ? input : output;
          const DataType dt = reduceType(any, "_reduce_scatter_base");
          const Reduction red = mapReduction(opts.reduceOp, dt, "_reduce_scatter_base");
          return cudaWork(cuda(owner, any, "_reduce_scatter_base")
                              ->reduceScatterBase(output, input, dt, red.op, red.factor),
                          rank_, size_);
        }
        auto work =
            NANOCCL_WORK(c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", {output});
        WorkNanoccl::start(work, {reduceScatterFlat(comm, *work, output, input, opts.reduceOp,
                                                    size_, "_reduce_scatter_base")});
        return work;
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return run(
      "reduce_scatter_tensor_coalesced", true, [&](Communicator& comm, const CommPtr& owner) {
        if (outputs.size() != inputs.size()) {
          reject("reduce_scatter_tensor_coalesced: " + std::to_string(outputs.size()) +
                 " outputs for " + std::to_string(inputs.size()) + " inputs");
        }
        auto work = NANOCCL_WORK(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED,
                                 "reduce_scatter_tensor_coalesced", outputs);
        std::vector<Queue> tasks;
        for (size_t i = 0; i < inputs.size(); ++i) {
          tasks.push_back(reduceScatterFlat(comm, *work, outputs[i], inputs[i], opts.reduceOp,
                                            size_, "reduce_scatter_tensor_coalesced"));
        }
        WorkNanoccl::start(work, std::move(tasks));
        return work;
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts) {
  return run("alltoall_base", true, [&](Communicator& comm, const CommPtr& owner) {
    checkTensor(input, "alltoall_base");
    checkTensor(output, "alltoall_base");
    checkSameType(input, output, "alltoall_base");
    const Wire w = moveType(input);
    // Split sizes count rows (the first dimension); empty means equal parts.
    auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* side) {
      std::vector<size_t> c;
      if (splits.empty()) {
        if (t.numel() % size_ != 0) {
          reject(std::string("alltoall_base: ") + side + " of " + std::to_string(t.numel()) +
                 " elements does not split into " + std::to_string(size_) + " equal parts");
        }
        c.assign(static_cast<size_t>(size_), count(t, w) / size_);
        return c;
      }
      if (static_cast<int>(splits.size()) != size_) {
        reject(std::string("alltoall_base: ") + side + " split sizes has " +
               std::to_string(splits.size()) + " entries for a group of " + std::to_string(size_));
      }
      const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
      const size_t perRow = rows == 0 ? 0 : count(t, w) / static_cast<size_t>(rows);
      int64_t sum = 0;
      for (int64_t s : splits) {
        if (s < 0) reject(std::string("alltoall_base: negative ") + side + " split size");
        sum += s;
        c.push_back(static_cast<size_t>(s) * perRow);
      }
      if (sum != rows) {
        reject(std::string("alltoall_base: ") + side + " split sizes add up to " +
               std::to_string(sum) + " rows, the tensor has " + std::to_string(rows));
      }
      return c;
    };
    const auto sendCounts = counts(input, inputSplitSizes, "input");
    const auto recvCounts = counts(output, outputSplitSizes, "output");
    auto work = NANOCCL_WORK(c10d::OpType::ALLTOALL_BASE, "alltoall_base", {output});
    at::Tensor send = input.is_contiguous() ? input : input.contiguous();
    work->hold(send);
    at::Tensor recv = nanoccl::output(*work, output, false);
    WorkNanoccl::start(
        work,
        {[&] { return comm.alltoall(ptr(send), sendCounts, ptr(recv), recvCounts, w.dtype); }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::alltoall(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllToAllOptions& opts) {
  return run("alltoall", true, [&](Communicator& comm, const CommPtr& owner) {
    if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_) {
      reject("alltoall: needs " + std::to_string(size_) + " input and output tensors, got " +
             std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
    }
    for (const auto& t : inputs) {
      checkTensor(t, "alltoall");
      checkSameType(inputs[0], t, "alltoall");
    }
    for (const auto& t : outputs) {
      checkTensor(t, "alltoall");
      checkSameType(inputs[0], t, "alltoall");
    }
    const Wire w = moveType(inputs[0]);
    auto work = NANOCCL_WORK(c10d::OpType::ALLTOALL, "alltoall", outputs);
    std::vector<size_t> sendCounts, recvCounts;
    for (const auto& t : inputs) sendCounts.push_back(count(t, w));
    for (const auto& t : outputs) recvCounts.push_back(count(t, w));
    at::Tensor send = concatInput(*work, inputs);
    at::Tensor recv = gatherBuffer(*work, outputs, inputs[0].options());
    WorkNanoccl::start(
        work,
        {[&] { return comm.alltoall(ptr(send), sendCounts, ptr(recv), recvCounts, w.dtype); }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::send(std::vector<at::Tensor>& tensors,
                                                         int dstRank, int tag) {
  return run("send", false, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(tensors, "send");
    if (dstRank == rank_) {
      reject("send: rank " + std::to_string(rank_) + " cannot send to itself (destination rank " +
             std::to_string(dstRank) + ")");
    }
    if (dstRank < 0 || dstRank >= size_) {
      reject("send: destination rank " + std::to_string(dstRank) + " is outside the group [0, " +
             std::to_string(size_) + ")");
    }
    const Wire w = moveType(tensors[0]);
    auto work =
        NANOCCL_WORK(c10d::OpType::SEND, "send to rank " + std::to_string(dstRank), tensors);
    at::Tensor buf = input(*work, tensors[0]);
    WorkNanoccl::start(work, {[&] {
                         return comm.send(ptr(buf), count(buf, w), w.dtype, dstRank,
                                          static_cast<uint32_t>(tag));
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::recv(std::vector<at::Tensor>& tensors,
                                                         int srcRank, int tag) {
  return run("recv", false, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(tensors, "recv");
    if (srcRank == rank_) {
      reject("recv: rank " + std::to_string(rank_) + " cannot receive from itself (source rank " +
             std::to_string(srcRank) + ")");
    }
    if (srcRank < 0 || srcRank >= size_) {
      reject("recv: source rank " + std::to_string(srcRank) + " is outside the group [0, " +
             std::to_string(size_) + ")");
    }
    const Wire w = moveType(tensors[0]);
    auto work =
        NANOCCL_WORK(c10d::OpType::RECV, "recv from rank " + std::to_string(srcRank), tensors);
    at::Tensor buf = output(*work, tensors[0], false);
    WorkNanoccl::start(work, {[&] {
                         return comm.recv(ptr(buf), count(buf, w), w.dtype, srcRank,
                                          static_cast<uint32_t>(tag));
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                  int tag) {
  return run("recvAnysource", false, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(tensors, "recvAnysource");
    const Wire w = moveType(tensors[0]);
    auto work = NANOCCL_WORK(c10d::OpType::RECVANYSOURCE, "recv from any rank", tensors);
    at::Tensor buf = output(*work, tensors[0], false);
    WorkNanoccl::start(work, {[&] {
                         return comm.recv(ptr(buf), count(buf, w), w.dtype, kAnySource,
                                          static_cast<uint32_t>(tag));
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::barrier(const c10d::BarrierOptions& opts) {
  return run("barrier", true, [&](Communicator& comm, const CommPtr& owner) {
    auto work = NANOCCL_WORK(c10d::OpType::BARRIER, "barrier", {});
    WorkNanoccl::start(work, {[&] { return comm.barrier(); }});
    return work;
  });
}

#undef NANOCCL_WORK

}  // namespace nanoccl
