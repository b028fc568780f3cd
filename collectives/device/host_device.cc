// HostDevice (host_device.h): the queue, its worker, and the node stage on the CPU.
#include "collectives/device/host_device.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <numeric>
#include <vector>

#include "collectives/algorithm.h"
#include "common/reduce.h"
#include "common/thread_name.h"

namespace nanoccl {

struct HostDevice::State {
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  uint64_t queued = 0;  // operations ever queued
  uint64_t ran = 0;     // operations run (in order: the first `ran` of them)
  uint64_t copies = 0;
  Status failed;
  bool stopping = false;
  bool held = false;
  std::chrono::microseconds delay{0};
  std::vector<std::unique_ptr<char[]>> slots = std::vector<std::unique_ptr<char[]>>(kStagingSlots);
  std::vector<size_t> slotBytes = std::vector<size_t>(kStagingSlots, 0);

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stopping || (!held && !queue.empty()); });
      if (stopping) return;
      std::function<void()> op = std::move(queue.front());
      queue.pop_front();
      const auto pause = delay;
      lock.unlock();
      if (pause.count() > 0) std::this_thread::sleep_for(pause);
      op();
      lock.lock();
      ++ran;
      cv.notify_all();
    }
  }

  Status push(std::function<void()> op) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed.isOk()) return failed;
    queue.push_back(std::move(op));
    ++queued;
    cv.notify_all();
    return Status::ok();
  }
};

namespace {

// A position in one HostDevice's queue: passed once that many operations have run.
struct HostFence : Fence {
  const void* owner = nullptr;
  uint64_t at = 0;
};

// The fence as this device's, or null where it is another device's.
const HostFence* ownFence(const Fence& fence, const void* owner) {
  const auto* f = dynamic_cast<const HostFence*>(&fence);
  return f != nullptr && f->owner == owner ? f : nullptr;
}

}  // namespace

HostDevice::HostDevice() : s_(std::make_shared<State>()) {
  State* s = s_.get();
  worker_ = namedThread("hdev", [s] { s->loop(); });
}

HostDevice::~HostDevice() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stopping = true;
    s_->cv.notify_all();
  }
  worker_.join();
}

double HostDevice::copyMBps() const {
  // Once a process: the second of two 8 MB memcpys (the first pays the page faults).
  static const double rate = [] {
    const size_t bytes = size_t{8} << 20;
    std::vector<char> a(bytes, 1), b(bytes);
    double seconds = 0;
    for (int i = 0; i < 2; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(b.data(), a.data(), bytes);
      volatile char last = b[bytes - 1];  // the copy is used: not optimized away
      (void)last;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return static_cast<double>(bytes) / std::max(seconds, 1e-6) / 1e6;
  }();
  return rate;
}

bool HostDevice::supports(DataType dtype, ReduceOp op) const {
  return op == ReduceOp::kNumOps || reduceOpSupported(op, dtype);
}

Status HostDevice::queueWait(const Fence& fence) {
  if (ownFence(fence, s_.get()) == nullptr) {
    return invalidArgument("host device: a fence of another device");
  }
  return Status::ok();  // one queue: whatever came before the fence runs first anyway
}

Status HostDevice::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::ok();
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    ++s_->copies;
  }
  return s_->push([dst, src, bytes] { std::memmove(dst, src, bytes); });
}

Result<std::shared_ptr<Fence>> HostDevice::record() {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->failed.isOk()) return s_->failed;
  auto f = std::make_shared<HostFence>();
  f->owner = s_.get();
  f->at = s_->queued;
  return std::shared_ptr<Fence>(std::move(f));
}

Result<bool> HostDevice::passed(const Fence& fence) {
  const HostFence* f = ownFence(fence, s_.get());
  if (f == nullptr) {
    return invalidArgument("host device: a fence of another device");
  }
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->failed.isOk()) return s_->failed;
  return s_->ran >= f->at;
}

Result<char*> HostDevice::staging(int slot, size_t bytes) {
  if (slot < 0 || slot >= kStagingSlots) {
    return invalidArgument("host device: no staging slot " + std::to_string(slot));
  }
  std::lock_guard<std::mutex> lock(s_->mu);
  const auto i = static_cast<size_t>(slot);
  if (s_->slotBytes[i] < bytes) {
    s_->slots[i] = std::make_unique<char[]>(bytes);
    s_->slotBytes[i] = bytes;
  }
  return s_->slots[i].get();
}

void HostDevice::abort(const Status& why) {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->failed.isOk()) return;
  s_->failed = why;
  s_->queue.clear();  // dropped: their fences never pass, passed() reports `why`
  s_->cv.notify_all();
}

void HostDevice::setOpDelay(std::chrono::microseconds delay) {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->delay = delay;
}

void HostDevice::hold(bool on) {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->held = on;
  s_->cv.notify_all();
}

Status HostDevice::enqueue(std::function<void()> fn) { return s_->push(std::move(fn)); }

uint64_t HostDevice::copies() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->copies;
}

// ---- The node stage on the CPU ----------------------------------------------------------------

Status HostDevice::nodeStage(detail::Context& node, const detail::CallArgs& call,
                             uint32_t tagBase) {
  using namespace detail;
  // Stream order: the stage starts once everything queued before it has run.
  NANOCCL_ASSIGN_OR_RETURN(std::shared_ptr<Fence> before, record());
  NANOCCL_CHECK(waitFence(*this, *before, node.deadline(), "the node stage's inputs"));
  if (node.size() == 1) return runLocal(call);

  const size_t es = call.elemSize();
  const ReduceOp op = kernelOp(call.redop);
  const bool avg = call.redop == ReduceOp::kAvg;
  char* recv = static_cast<char*>(call.recv);
  auto segments = [&](char* base, const std::vector<size_t>& counts) {
    std::vector<char*> out;
    for (size_t at : prefixOffsets(counts)) out.push_back(base + at * es);
    return out;
  };
  auto chunkFor = [&](const std::vector<size_t>& counts) {
    return chunkElements(node, es, *std::max_element(counts.begin(), counts.end()), 256);
  };
  switch (call.op) {
    case OpType::kAllreduce: {
      NANOCCL_CHECK(premultiplied(node, call, recv, call.count, recv).status());
      const std::vector<size_t> counts = evenSplit(call.count, node.size());
      NANOCCL_CHECK(ringAllreduceAt(node, recv, call.count, call.dtype, op, chunkFor(counts),
                                    tagBase));
      return avg ? divideInPlace(recv, call.count, call.dtype, node.size()) : Status::ok();
    }
    case OpType::kReduceScatter: {
      const size_t total = std::accumulate(call.counts.begin(), call.counts.end(), size_t{0});
      const size_t mine = call.counts[static_cast<size_t>(node.rank())];
      // In place (recv is this rank's segment of send, memory of the plan's own): reduce there;
      // else on a copy, so that the caller's input is left as it was.
      char* send = const_cast<char*>(static_cast<const char*>(call.send));
      const bool inPlace = recv == send + prefixOffsets(call.counts)[node.rank()] * es;
      char* work = inPlace ? send : node.scratch(total * es);
      if (!inPlace) std::memcpy(work, send, total * es);
      NANOCCL_CHECK(premultiplied(node, call, work, total, work).status());
      const std::vector<char*> seg = segments(work, call.counts);
      const std::vector<const char*> src(seg.begin(), seg.end());
      NANOCCL_CHECK(ringReduceScatter(node, call.counts, src, seg, call.dtype, op,
                                      chunkFor(call.counts), tagBase));
      if (!inPlace) std::memcpy(recv, seg[node.rank()], mine * es);
      return avg ? divideInPlace(recv, mine, call.dtype, node.size()) : Status::ok();
    }
    case OpType::kAllgather: {
      const std::vector<char*> seg = segments(recv, call.counts);
      if (seg[node.rank()] != call.send) std::memmove(seg[node.rank()], call.send, call.count * es);
      return ringAllgather(node, call.counts, seg, es, chunkFor(call.counts), tagBase);
    }
    case OpType::kReduce: {
      NANOCCL_ASSIGN_OR_RETURN(const char* input,
                               premultiplied(node, call, recv, call.count, nullptr));
      NANOCCL_CHECK(treeReduce(node, input, recv, call.count, call.dtype, op, call.root, tagBase));
      const bool root = node.rank() == call.root;
      return avg && root ? divideInPlace(recv, call.count, call.dtype, node.size()) : Status::ok();
    }
    case OpType::kBroadcast:
      return treeBroadcast(node, recv, call.count * es, call.root, tagBase);
    default:
      return invalidArgument(std::string("host device: no node stage for ") +
                             opTypeName(call.op));
  }
}

}  // namespace nanoccl
