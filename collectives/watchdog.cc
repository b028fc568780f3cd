// Point-to-point calls (Impl::postP2p, finishP2p), the device calls' end fences
// (rememberDevice, watchDevice), and the watchdog thread that fails either where it outlives
// its deadline (watchdogLoop).
#include "collectives/communicator.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator_impl.h"
#include "common/logging.h"

namespace nanoccl {

using detail::completeTask;
using detail::P2pCall;
using detail::sizeText;
using detail::validDataType;

std::shared_ptr<Task> Communicator::Impl::postP2p(bool isSend, void* buf, size_t count,
                                                  DataType dtype, int peer, uint32_t tag) {
  auto task = std::make_shared<Task>();
  std::string what = who() + (isSend ? "send to rank " : "recv from ");
  if (!isSend) what += peer == kAnySource ? "any rank" : "rank ";
  if (isSend || peer != kAnySource) what += std::to_string(peer);
  what += " (tag " + std::to_string(tag) + ", " + sizeText(dtype, count) + ")";

  Status invalid;
  if (!validDataType(dtype)) {
    invalid = invalidArgument("invalid data type");
  } else if (isSend ? (peer < 0 || peer >= size)
                    : (peer != kAnySource && (peer < 0 || peer >= size))) {
    invalid = invalidArgument("peer " + std::to_string(peer) + " is not a rank of this " +
                              std::to_string(size) + "-rank communicator");
  } else if (peer == rank) {
    invalid =
        invalidArgument(std::string(isSend ? "send to" : "receive from") + " this rank itself");
  } else if (size == 1) {
    invalid = invalidArgument("a communicator of size 1 has no peer to receive from");
  } else if (buf == nullptr && count > 0) {
    invalid = invalidArgument("null buffer for " + std::to_string(count) + " elements");
  }
  if (!invalid.isOk()) {
    task->complete(invalidArgument(what + ": " + invalid.message()));
    return task;
  }

  const size_t bytes = count * dataTypeSize(dtype);
  uint64_t id;
  bool wakeWorker = false;
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!failed.isOk() || stopping) {
      const Status s =
          laterFailure(what + ": ", failed.isOk() ? abortedError("destroyed") : failed);
      lock.unlock();
      task->complete(s);
      return task;
    }
    // The caller has moved on to point-to-point: queued collectives go to the worker now (one
    // left for the caller's wait could be what this message's peer waits on first).
    wakeWorker = markHandOver();
    id = nextP2pId++;
    P2pCall& entry = p2p[id];
    entry.task = task;
    entry.deadline = Deadline::after(timeout);
    entry.what = what;
    entry.isSend = isSend;
    entry.bytes = bytes;
    startWatchdog();
  }
  watchCv.notify_all();
  if (wakeWorker) workBell.ring();

  // Point-to-point messages are told apart from collectives by the op; the user's tag and the
  // FIFO order per (peer, tag) match them.
  const Envelope env{OpFingerprint{OpType::kSendRecv, dtype, ReduceOp::kSum, -1, count, 0}, tag};
  std::shared_ptr<Request> request =
      isSend ? transport->isend(peer, env, buf, bytes) : transport->irecv(peer, env, buf, bytes);
  {
    // Keep the request alive with its entry (unless it has already completed).
    std::lock_guard<std::mutex> lock(mu);
    auto it = p2p.find(id);
    if (it != p2p.end()) it->second.request = request;
  }
  request->setCallback([this, id](const Status& s, int source) { finishP2p(id, s, source); });
  return task;
}

void Communicator::Impl::finishP2p(uint64_t id, const Status& status, int source) {
  P2pCall call;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = p2p.find(id);
    if (it == p2p.end()) return;  // the watchdog failed it already
    call = std::move(it->second);
    p2p.erase(it);
  }
  watchCv.notify_all();
  if (status.isOk()) {
    const auto op = static_cast<size_t>(OpType::kSendRecv);
    (call.isSend ? sentPerOp : receivedPerOp)[op] += call.bytes;
    ++calls;
    completeTask(*call.task, Status::ok(), source);
  } else {
    // As after a failed collective, the communicator is unusable: fail it, so that a peer
    // waiting on this rank in a stage of another call (on a cross group's own rail, which this
    // transport's failure does not reach) hears it now, not at its timeout.
    const Status s(status.code(), call.what + ": " + status.message());
    fail(s);
    completeTask(*call.task, s, source);
  }
}

void Communicator::Impl::rememberDevice(const std::shared_ptr<Device>& device) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = devices.begin(); it != devices.end();) {
    std::shared_ptr<Device> d = it->lock();
    if (d == device) return;
    it = d ? it + 1 : devices.erase(it);
  }
  devices.push_back(device);
}

void Communicator::Impl::watchDevice(const detail::QueuedCall& call, std::shared_ptr<Fence> end,
                                     Clock::time_point started) {
  if (size == 1) return;  // no peer to wait for
  {
    std::lock_guard<std::mutex> lock(mu);
    onDevice.push_back(detail::DeviceInFlight{
        call.args.device, std::move(end), call.deadline, who() + call.fingerprint.describe(),
        call.algorithm, call.fingerprint.codec, call.predictedSeconds, started});
    startWatchdog();
  }
  watchCv.notify_all();
}

namespace {
constexpr auto kDevicePoll = std::chrono::milliseconds(1);
}  // namespace

// Point-to-point requests have no deadline of their own in the transport, and a pending
// receive can only be withdrawn by aborting the transport: so a p2p call that outlives the
// timeout fails the communicator, as a collective would.
//
// A device call's work ends on the device after its Task completed: the watchdog polls its end
// fence (every kDevicePoll) and, where the device has not passed it by the call's deadline or
// reports an error, fails the communicator, which aborts the device (its queued work ends).
void Communicator::Impl::watchdogLoop() {
  std::unique_lock<std::mutex> lock(mu);
  while (!stopping) {
    if (p2p.empty() && onDevice.empty()) {
      watchCv.wait(lock);
      continue;
    }
    Clock::time_point earliest = Clock::time_point::max();
    for (const auto& [id, call] : p2p) earliest = std::min(earliest, call.deadline.at());
    if (!onDevice.empty()) earliest = std::min(earliest, Clock::now() + kDevicePoll);
    watchCv.wait_until(lock, earliest);
    if (!onDevice.empty()) {
      std::vector<detail::DeviceInFlight> watched = std::move(onDevice);
      onDevice.clear();
      lock.unlock();
      Status problem;
      std::vector<detail::DeviceInFlight> left;
      for (detail::DeviceInFlight& d : watched) {
        Result<bool> passed = d.device->passed(*d.end);
        if (passed.isOk() && passed.value()) {
          if (d.predictedSeconds != detail::kNoPrediction) {
            recordTiming(d.algorithm, d.codec, d.predictedSeconds,
                         std::chrono::duration<double>(Clock::now() - d.started).count());
          }
          continue;
        }
        if (problem.isOk() && !passed.isOk()) {
          problem = Status(passed.status().code(), d.what + ": on the " + d.device->describe() +
                                                       ": " + passed.status().message());
        } else if (problem.isOk() && d.deadline.expired()) {
          problem = timeoutError(d.what + ": its work on the " + d.device->describe() +
                                 " did not end within the timeout (" +
                                 std::to_string(timeout.count()) +
                                 " ms): a peer died or stopped calling? The device was aborted");
        }
        left.push_back(std::move(d));
      }
      if (!problem.isOk()) {
        left.clear();
        NANOCCL_WARN(problem.toString());
        fail(problem);
      }
      lock.lock();
      for (detail::DeviceInFlight& d : left) onDevice.push_back(std::move(d));
    }
    std::vector<P2pCall> expired;
    for (auto it = p2p.begin(); it != p2p.end();) {
      if (it->second.deadline.expired()) {
        expired.push_back(std::move(it->second));
        it = p2p.erase(it);
      } else {
        ++it;
      }
    }
    if (expired.empty()) continue;
    lock.unlock();
    for (P2pCall& call : expired) {
      const Status s =
          timeoutError(call.what + ": timed out after " + std::to_string(timeout.count()) +
                       " ms; no matching message arrived");
      NANOCCL_WARN(s.toString());
      fail(s);
      Status final = s;
      detail::Context::Leftover left;
      if (call.request && !call.request->test()) left.requests.push_back(call.request);
      keepLeftover(std::move(left), *call.task, final);
      completeTask(*call.task, final);
    }
    lock.lock();
  }
}

}  // namespace nanoccl
