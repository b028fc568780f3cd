// cuda_staging.h in a build without NANOCCL_WITH_CUDA: create() says why there is no CUDA, so
// the backend can reject CUDA tensors with that reason and needs no #if.
#include "backend/cuda_staging.h"

namespace nanoccl {
namespace {

Status notBuilt() {
  return unavailableError(
      "nanoccl was built without CUDA (NANOCCL_WITH_CUDA is OFF, or CMake found no nvcc or no "
      "NCCL): use \"cpu:nanoccl,cuda:nccl\" or move the tensors to the CPU");
}

}  // namespace

struct CudaJob::Impl {};

CudaJob::CudaJob(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaJob::~CudaJob() = default;
Status CudaJob::waitEnqueued(const Deadline&) const { return notBuilt(); }
Status CudaJob::blockStream(void*) const { return notBuilt(); }
bool CudaJob::finished() const { return true; }
Status CudaJob::status() const { return notBuilt(); }
void CudaJob::onEnqueued(std::function<void(const Status&)> cb) { cb(notBuilt()); }
void CudaJob::onFinished(std::function<void(const Status&)> cb) { cb(notBuilt()); }

struct CudaGroup::Impl {};

bool CudaGroup::built() { return false; }
bool CudaGroup::supports(DataType, ReduceOp) { return false; }
CudaGroup::CudaGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Result<std::shared_ptr<CudaGroup>> CudaGroup::create(const CudaGroupOptions&) {
  return notBuilt();
}
CudaGroup::~CudaGroup() = default;
int CudaGroup::device() const { return -1; }
Result<std::shared_ptr<CudaJob>> CudaGroup::submit(const CudaCall&, void*) { return notBuilt(); }
void CudaGroup::abort(const Status&) {}
void CudaGroup::shutdown(const Deadline&) {}
CommStats CudaGroup::stats() const { return {}; }

}  // namespace nanoccl
