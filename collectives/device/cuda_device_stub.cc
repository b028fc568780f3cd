// cuda_device.h in a build without NANOCCL_WITH_CUDA: create() says why there is no CUDA, so
// the backend can reject CUDA tensors with that reason and needs no #if.
#include "collectives/device/cuda_device.h"

namespace nanoccl {
namespace {

Status notBuilt() {
  return unavailableError(
      "nanoccl was built without CUDA (NANOCCL_WITH_CUDA is OFF, or CMake found no nvcc or no "
      "NCCL): use \"cpu:nanoccl,cuda:nccl\" or move the tensors to the CPU");
}

}  // namespace

struct CudaDevice::Impl {};

bool CudaDevice::built() { return false; }
bool CudaDevice::reduces(DataType, ReduceOp) { return false; }
Result<std::shared_ptr<CudaDevice>> CudaDevice::create(int, void*) { return notBuilt(); }
CudaDevice::CudaDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaDevice::~CudaDevice() = default;
Result<std::shared_ptr<Fence>> CudaDevice::recordOn(void*) { return notBuilt(); }
Status CudaDevice::blockStream(const Fence&, void*) { return notBuilt(); }
void CudaDevice::shutdown(const Deadline&) {}
std::string CudaDevice::describe() const { return "CUDA (not built)"; }
double CudaDevice::copyMBps() const { return 0; }
Status CudaDevice::queueWait(const Fence&) { return notBuilt(); }
Status CudaDevice::copy(void*, const void*, size_t) { return notBuilt(); }
Result<std::shared_ptr<Fence>> CudaDevice::record() { return notBuilt(); }
Result<bool> CudaDevice::passed(const Fence&) { return notBuilt(); }
Result<char*> CudaDevice::staging(int, size_t) { return notBuilt(); }
Status CudaDevice::nodeStage(detail::Context&, const detail::CallArgs&, uint32_t) {
  return notBuilt();
}
void CudaDevice::abort(const Status&) {}

}  // namespace nanoccl
