// CudaGroup's plans (cuda_staging.h): how each call runs (one NCCL collective on one node; across
// nodes the hierarchical allreduce, and the staged broadcast, allgather and reduce_scatter), and
// the chunked pinned-memory staging under them. They run on the executor (cuda_staging.cc);
// CudaGroup::Impl is declared in cuda_staging_impl.h.
#include "backend/cuda_staging.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda_staging_impl.h"
#include "common/reduce.h"
#include "transports/nccl/nccl_comm.h"

namespace nanoccl {

using cuda_staging::kChunkBuffers;
using cuda_staging::kChunkBytes;

namespace {

std::vector<size_t> splitEvenly(size_t count, int parts) {
  std::vector<size_t> out(static_cast<size_t>(parts), count / parts);
  for (size_t i = 0; i < count % parts; ++i) ++out[i];
  return out;
}

}  // namespace

// ---- CudaGroup::Impl: the plans ---------------------------------------------------------------

Status CudaGroup::Impl::runJob(CudaJob& job) {
  CudaJob::Impl& j = job.impl();
  const CudaCall& c = j.call;
  NANOCCL_CUDA("cudaStreamWaitEvent", cudaStreamWaitEvent(stream, j.start, 0));
  const char* plan = m == 1 ? "cuda_nccl" : "cuda_staged";
  if (c.count > 0) {
    if (m == 1) {
      NANOCCL_CHECK(singleNode(c, j.deadline));
    } else if (c.op == OpType::kAllreduce) {
      NANOCCL_CHECK(hierarchicalAllreduce(c, j.deadline));
    } else if (c.op == OpType::kBroadcast) {
      NANOCCL_CHECK(stagedBroadcast(c, j.deadline));
    } else {
      NANOCCL_CHECK(stagedGather(c, j.deadline));
    }
  }
  if (c.epilogue) NANOCCL_CHECK(c.epilogue());
  NANOCCL_CUDA("cudaEventRecord", cudaEventRecord(j.end, stream));
  std::lock_guard<std::mutex> lock(mu);
  ++plans[std::string(opTypeName(c.op)) + "/" + plan];
  return Status::ok();
}

// All ranks on one node: one NCCL collective (NCCL rank = local rank = group rank).
Status CudaGroup::Impl::singleNode(const CudaCall& c, const Deadline& d) {
  NANOCCL_ASSIGN_OR_RETURN(NcclComm * nc, ensureNccl(d));
  const size_t es = dataTypeSize(c.dtype);
  const void* send = c.send != nullptr ? c.send : c.recv;
  switch (c.op) {
    case OpType::kAllreduce:
      return nc->allreduce(send, c.recv, c.count, c.dtype, c.redop, c.premulFactor, stream, d);
    case OpType::kBroadcast:  // data movement: as bytes, so that every dtype goes
      return nc->broadcast(send, c.recv, c.count * es, DataType::kUInt8, c.root, stream, d);
    case OpType::kAllgather:
      return nc->allgather(c.send, c.recv, c.count * es, DataType::kUInt8, stream, d);
    case OpType::kReduceScatter:
      return nc->reduceScatter(c.send, c.recv, c.count, c.dtype, c.redop, c.premulFactor,
                               stream, d);
    default:
      return invalidArgument(std::string("no CUDA plan for ") + opTypeName(c.op));
  }
}

// Intra-node reduce into shards (NCCL), each shard staged across nodes by its local rank,
// intra-node gather of the shards (NCCL).
Status CudaGroup::Impl::hierarchicalAllreduce(const CudaCall& c, const Deadline& d) {
  const size_t es = dataTypeSize(c.dtype);
  const size_t n = c.count;
  char* buf = static_cast<char*>(c.recv);
  if (c.send != nullptr && c.send != c.recv) {
    NANOCCL_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(buf, c.send, n * es,
                                                    cudaMemcpyDeviceToDevice, stream));
  }
  // Where each rank's input first meets a reduction, PREMUL_SUM scales it: in NCCL if the
  // node has several ranks, else across nodes. AVG sums and divides once at the end.
  const bool intra = localSize > 1;
  const ReduceOp sumOrOp = c.redop == ReduceOp::kAvg ? ReduceOp::kSum : c.redop;
  ReduceOp crossOp = sumOrOp;
  if (c.redop == ReduceOp::kPremulSum && intra) crossOp = ReduceOp::kSum;
  const std::vector<size_t> shard = splitEvenly(n, shards);
  std::vector<size_t> at(shard.size(), 0);
  for (size_t s = 1; s < shard.size(); ++s) at[s] = at[s - 1] + shard[s - 1];
  // Equal shards, one per local rank: NCCL's in-place reduce-scatter and allgather.
  const bool even = shards == localSize && n % localSize == 0;
  NcclComm* nc = nullptr;
  if (intra) {
    NANOCCL_ASSIGN_OR_RETURN(nc, ensureNccl(d));
    if (even) {
      NANOCCL_CHECK(nc->reduceScatter(buf, buf + at[local] * es, shard[local], c.dtype, sumOrOp,
                                      c.premulFactor, stream, d));
    } else {
      NANOCCL_CHECK(nc->groupStart());
      for (int s = 0; s < shards; ++s) {
        if (shard[s] == 0) continue;
        char* p = buf + at[s] * es;
        const Status st = nc->reduce(p, p, shard[s], c.dtype, sumOrOp, c.premulFactor, s,
                                     stream, d);
        if (!st.isOk()) {
          (void)nc->groupEnd(d);
          return st;
        }
      }
      NANOCCL_CHECK(nc->groupEnd(d));
    }
  }
  if (local < shards && shard[local] > 0) {
    NANOCCL_ASSIGN_OR_RETURN(auto x, ensureCross());
    const double factor = crossOp == ReduceOp::kPremulSum ? c.premulFactor : 1.0;
    const bool divide = c.redop == ReduceOp::kAvg;
    NANOCCL_CHECK(stage(buf + at[local] * es, shard[local], es, true, true,
                        [&](void* host, size_t count) -> Status {
                          auto task = x->allreduce(host, count, c.dtype, crossOp, factor);
                          NANOCCL_CHECK(task->wait(d));
                          if (divide) {
                            NANOCCL_CHECK(divideInPlace(host, count, c.dtype, o.size));
                          }
                          return Status::ok();
                        },
                        d));
  }
  if (intra) {
    if (even) {
      NANOCCL_CHECK(nc->allgather(buf + at[local] * es, buf, shard[local], c.dtype, stream, d));
    } else {
      NANOCCL_CHECK(nc->groupStart());
      for (int s = 0; s < shards; ++s) {
        if (shard[s] == 0) continue;
        char* p = buf + at[s] * es;
        const Status st = nc->broadcast(p, p, shard[s], c.dtype, s, stream, d);
        if (!st.isOk()) {
          (void)nc->groupEnd(d);
          return st;
        }
      }
      NANOCCL_CHECK(nc->groupEnd(d));
    }
  }
  return Status::ok();
}

// The root's bytes to the host, the group's CPU broadcast, back to the device elsewhere.
Status CudaGroup::Impl::stagedBroadcast(const CudaCall& c, const Deadline& d) {
  NANOCCL_ASSIGN_OR_RETURN(auto w, ensureWorld());
  const bool root = o.rank == c.root;
  const size_t bytes = c.count * dataTypeSize(c.dtype);
  if (c.send != nullptr && c.send != c.recv && root) {
    NANOCCL_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(c.recv, c.send, bytes,
                                                    cudaMemcpyDeviceToDevice, stream));
  }
  return stage(static_cast<char*>(c.recv), bytes, 1, root, !root,
               [&](void* host, size_t count) -> Status {
                 return w->broadcast(host, count, DataType::kUInt8, c.root)->wait(d);
               },
               d);
}

// allgather / reduce_scatter: the whole input to the host, the group's CPU call, the result
// back (not chunked: the CPU call needs every rank's part at once).
Status CudaGroup::Impl::stagedGather(const CudaCall& c, const Deadline& d) {
  NANOCCL_ASSIGN_OR_RETURN(auto w, ensureWorld());
  const size_t es = dataTypeSize(c.dtype);
  const size_t part = c.count * es;
  const size_t all = part * static_cast<size_t>(o.size);
  // The bulk buffer may be read by the previous call's copy back: wait before regrowing it.
  if (bulk.bytes() < all + part) {
    NANOCCL_CHECK(drain(d));
    NANOCCL_CHECK(bulk.ensure(all + part));
  }
  char* host = bulk.data();
  const bool gather = c.op == OpType::kAllgather;
  char* in = gather ? host + part * static_cast<size_t>(o.rank) : host;
  char* out = gather ? host : host + all;
  NANOCCL_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(in, c.send, gather ? part : all,
                                                  cudaMemcpyDeviceToHost, stream));
  NANOCCL_CUDA("cudaEventRecord", cudaEventRecord(ready[0], stream));
  NANOCCL_CHECK(waitEvent(ready[0], d, "the copy to the host"));
  std::shared_ptr<Task> task;
  if (gather) {
    const std::vector<size_t> counts(static_cast<size_t>(o.size), part);
    task = w->allgather(in, part, out, counts, DataType::kUInt8);
  } else {
    const std::vector<size_t> counts(static_cast<size_t>(o.size), c.count);
    task = w->reduceScatter(in, out, counts, c.dtype, c.redop, c.premulFactor);
  }
  NANOCCL_CHECK(task->wait(d));
  NANOCCL_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(c.recv, out, gather ? all : part,
                                                  cudaMemcpyHostToDevice, stream));
  return Status::ok();
}

// Moves `n` elements (`es` bytes each) at `dev` through the pinned chunk buffers: for each
// chunk the copy to the host (download), `hostOp` on the host copy, the copy back (upload).
// The copies run on the internal stream ahead of the host: while hostOp works on chunk c,
// chunk c + 1 is already coming down and chunk c - 1 going up. A buffer is reused for chunk
// c + 2 only after chunk c's copy back (stream order, and its ready event).
Status CudaGroup::Impl::stage(char* dev, size_t n, size_t es, bool download, bool upload,
                              const std::function<Status(void*, size_t)>& hostOp,
                              const Deadline& d) {
  if (n == 0) return Status::ok();
  for (auto& b : chunks) NANOCCL_CHECK(b.ensure(kChunkBytes));
  const size_t per = std::max<size_t>(1, kChunkBytes / es);
  const size_t count = (n + per - 1) / per;
  auto ahead = [&](size_t c) -> Status {
    const int b = static_cast<int>(c % kChunkBuffers);
    if (download) {
      const size_t first = c * per;
      NANOCCL_CUDA("cudaMemcpyAsync",
                   cudaMemcpyAsync(chunks[b].data(), dev + first * es,
                                   std::min(per, n - first) * es, cudaMemcpyDeviceToHost,
                                   stream));
    }
    NANOCCL_CUDA("cudaEventRecord", cudaEventRecord(ready[b], stream));
    return Status::ok();
  };
  for (size_t c = 0; c < std::min<size_t>(count, kChunkBuffers); ++c) NANOCCL_CHECK(ahead(c));
  for (size_t c = 0; c < count; ++c) {
    const int b = static_cast<int>(c % kChunkBuffers);
    const size_t first = c * per;
    const size_t len = std::min(per, n - first);
    NANOCCL_CHECK(waitEvent(ready[b], d, download ? "the copy to the host" : "the copy back"));
    NANOCCL_CHECK(hostOp(chunks[b].data(), len));
    if (upload) {
      NANOCCL_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(dev + first * es, chunks[b].data(),
                                                      len * es, cudaMemcpyHostToDevice, stream));
    }
    if (c + kChunkBuffers < count) NANOCCL_CHECK(ahead(c + kChunkBuffers));
  }
  return Status::ok();
}

}  // namespace nanoccl
