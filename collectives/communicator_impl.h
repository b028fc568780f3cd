// Communicator::Impl: the private half of a Communicator (collectives/communicator.h). It holds
// the communicator's state (transports, topology, the queue of collectives, the table of
// point-to-point calls, the counters behind stats()) and declares the machinery that runs the
// calls. Private to the Communicator: included only by communicator.cc (create, shutdown),
// call_queue.cc (Task, the queue and the worker), watchdog.cc (point-to-point and the
// watchdog), stats.cc (stats) and calls.cc (the public calls, which validate their arguments
// and queue through submit() or postP2p()).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/communicator.h"
#include "collectives/cost_model.h"
#include "collectives/planner.h"
#include "common/alarm_bell.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "transports/routed/routed_transport.h"

namespace nanoccl {
namespace detail {

// A collective waiting in Impl::queue for its turn (Impl::submit), and then running.
struct QueuedCall {
  std::shared_ptr<Task> task;
  Clock::time_point issued;
  Deadline deadline = Deadline::never();  // issue time + the timeout
  OpFingerprint fingerprint;
  CallArgs args;
  const AlgorithmRow* algorithm = nullptr;
  double predictedSeconds = detail::kNoPrediction;  // the cost model's, where it has one
};

// The calls issued inside one CallScope, in Impl::scopes while the scope is open or has calls.
struct ScopeQueue {
  const CallScope* scope = nullptr;
  uint64_t call = 0;  // the sequence number of the call whose completion the scope is
  bool open = true;
  std::deque<QueuedCall> calls;
};

// A device call whose work is queued on its device (Task::deviceEnd()), in Impl::onDevice until
// the device passes its end fence or the watchdog fails it at its deadline.
struct DeviceInFlight {
  std::shared_ptr<Device> device;
  std::shared_ptr<Fence> end;
  Deadline deadline = Deadline::never();
  std::string what;  // "rank 0: allreduce #4 (float32 x 8, sum, on the device)"
  // For its measured time beside the cost model's (Impl::recordTiming).
  const AlgorithmRow* algorithm = nullptr;
  uint8_t codec = 0;
  double predictedSeconds = kNoPrediction;
  Clock::time_point started;
};

// A posted send or receive, in Impl::p2p until it completes or the watchdog fails it.
struct P2pCall {
  std::shared_ptr<Task> task;
  std::shared_ptr<Request> request;
  Deadline deadline = Deadline::never();
  std::string what;  // "rank 0: recv from rank 1 (tag 3, float32 x 8)"
  OpType op = OpType::kSendRecv;
  bool isSend = false;
  size_t bytes = 0;
};

constexpr size_t kNumOpTypes = static_cast<size_t>(OpType::kNumOps);

// Used by the calls' checks (calls.cc) and by postP2p() (watchdog.cc).
inline bool validDataType(DataType t) {
  return static_cast<size_t>(t) < static_cast<size_t>(DataType::kNumTypes);
}

// "float32 x 8", for the messages of submit() and heldTooLong() (call_queue.cc) and postP2p()
// (watchdog.cc).
inline std::string sizeText(DataType dtype, size_t count) {
  return std::string(dataTypeName(dtype)) + " x " + std::to_string(count);
}

// Non-zero while this thread runs Task callbacks: a communicator destroyed from inside one
// (its last reference dropped there) may be running on one of its own threads, which cannot
// join themselves.
inline thread_local int tlsInCallbacks = 0;

// Completes `task` where the worker, a caller (call_queue.cc) or the watchdog and the
// transport's callbacks (watchdog.cc) finish a call; ~Communicator reads tlsInCallbacks.
inline void completeTask(Task& task, const Status& status, int source = -1) {
  ++tlsInCallbacks;
  task.complete(status, source);
  --tlsInCallbacks;
}

}  // namespace detail

// Threads: the caller's (submit, p2p posting, stats), one worker (runs queued collectives in
// order), one watchdog (p2p deadlines, device calls' end fences: started by the first such
// call, so a job of host collectives alone never runs one), the hierarchy's StageHelper (the
// first pipelined hierarchical allreduce starts it), and the transport's progress threads
// (p2p completions).
// `mu` guards the queue, the failure state and the p2p table; it is never held while calling
// into the transport or completing a Task.
struct Communicator::Impl {
  int rank = 0;
  int size = 1;
  std::string commId;
  Config config;
  std::chrono::milliseconds timeout{0};
  // How long the worker leaves a lone fresh call to its caller (Task::runHere): NANOCCL_SPIN_US.
  std::chrono::microseconds handOverGrace{0};
  std::unique_ptr<Transport> transport;  // null for size 1: nothing to talk to
  // What carries `transport`'s bytes, for stats(): `routed` points into it where it is routed,
  // else it is one transport of table name `transportKind`.
  routed::RoutedTransport* routed = nullptr;
  std::string transportKind;
  // The links as measured or loaded at creation (collectives/tuning.h); null under tuning=off
  // and on one rank.
  std::shared_ptr<const LinkProfile> profile;
  Topology topology;
  // The groups of a hierarchical topology (on `transport`, or a cross group's own), only where
  // the topology is hierarchical. Set up before the threads start and torn down after they are
  // joined; in between only the threads running the current call (the worker or a caller in
  // Task::runHere, and the hierarchy's StageHelper) use them (abort() is thread-safe).
  std::unique_ptr<detail::Hierarchy> hierarchy;
  // Calls run per row of the algorithm table (index = row - table.data()).
  std::unique_ptr<std::atomic<uint64_t>[]> callsPerRow;
  // Calls the cost model predicted, per (row index, codec id): predicted and measured seconds.
  std::mutex timingMu;
  std::map<std::pair<size_t, uint8_t>, CommStats::Timing> timings;
  // The Communicator that owns this Impl, for the Tasks' runHere().
  std::weak_ptr<Communicator> self;

  std::mutex mu;
  // The worker sleeps on it; ring() where it has something to do (kTick, in call_queue.cc,
  // says when a call is left to its caller instead).
  AlarmBell workBell;
  // The worker's hand-over (kTick): when the bell's alarm is set to go off (under `mu`), and
  // whether queued calls go to the worker at once (handOver()).
  Clock::time_point alarmAt{};
  bool handOverNow = false;
  std::condition_variable watchCv;
  std::deque<detail::QueuedCall> queue;
  // Open scopes and scopes with calls left (CallScope), innermost last: the calls of the
  // innermost run first; while it is open and has none, every other call waits.
  std::vector<detail::ScopeQueue> scopes;
  // Assigned when a call starts (takeNext), so that the numbers follow the order calls run in,
  // which scopes make differ from the order they were issued in.
  uint64_t nextSeq = 1;
  bool running = false;
  bool stopping = false;
  bool destroyed = false;
  Status failed;  // the first failure; OK while the communicator is healthy
  std::map<uint64_t, detail::P2pCall> p2p;
  uint64_t nextP2pId = 1;
  // Device calls whose device work has not been seen to end (watchdogLoop polls them), and
  // every device a call ran on, aborted with the communicator (fail()).
  std::vector<detail::DeviceInFlight> onDevice;
  std::vector<std::weak_ptr<Device>> devices;
  std::thread worker;
  std::thread watchdog;  // started by startWatchdog(), joined in shutdown()
  // Under `mu`: starts the watchdog unless it runs (or the communicator is being destroyed).
  void startWatchdog() {
    if (!watchdog.joinable() && !stopping) {
      watchdog = namedThread("watch", [this] { watchdogLoop(); });
    }
  }

  // Scratch memory from one call to the next (calls run one at a time).
  detail::ScratchPool scratchPool;
  // Memory that failed calls' unfinished transfers may still target (Context::Leftover, and
  // callers' buffers from keepUntilDestroyed()): released in shutdown(), once the transports
  // are destroyed.
  // Tasks that say buffersStillInUse() hold it too, so a caller can hand over its buffers
  // while the communicator is being destroyed.
  std::shared_ptr<KeptBuffers> kept = std::make_shared<KeptBuffers>();
  std::atomic<uint64_t> callsWithKeptBuffers{0};

  // After a failed call, its transports aborted: keeps what `left` holds where transfers did
  // not end, marks `task`, and says so in `s`.
  void keepLeftover(detail::Context::Leftover left, Task& task, Status& s) {
    if (left.requests.empty()) return;
    const size_t n = left.requests.size();
    kept->keep(std::make_shared<detail::Context::Leftover>(std::move(left)));
    callsWithKeptBuffers.fetch_add(1);
    task.keeper_ = kept;
    task.buffersInUse_.store(true, std::memory_order_release);
    s = Status(s.code(), s.message() + " [" + std::to_string(n) +
                             " transfer(s) on this call's buffers could not be stopped: its "
                             "buffers must stay allocated until the communicator is destroyed]");
    NANOCCL_WARN(who() << n << " transfer(s) of a failed call still target its buffers after "
                          "the abort; they are kept until the communicator is destroyed");
  }

  std::array<std::atomic<uint64_t>, detail::kNumOpTypes> sentPerOp{};
  std::array<std::atomic<uint64_t>, detail::kNumOpTypes> receivedPerOp{};
  std::atomic<uint64_t> calls{0};

  std::string who() const { return "rank " + std::to_string(rank) + ": "; }

  // What a call queued after the first failure fails with: the first failure's code, and its
  // message so the root cause is visible from any later call.
  Status laterFailure(const std::string& what, const Status& first) const {
    if (destroyed) return abortedError(what + "communicator destroyed");
    return Status(first.code(), what + "communicator failed earlier: " + first.message());
  }

  // Every transport this communicator owns: its own, and a cross group's on a rail of its own.
  std::vector<Transport*> transports() const {
    std::vector<Transport*> out;
    if (transport) out.push_back(transport.get());
    if (hierarchy && hierarchy->cross.own) out.push_back(hierarchy->cross.own.get());
    return out;
  }

  // Records the first failure and aborts every transport, so the peers fail fast too: a peer
  // waiting in a hierarchical stage hears it on the transport it waits on.
  // The devices of its calls are aborted too, so that their queued work ends (NCCL's kernels
  // return) and their fences report the failure.
  void fail(const Status& why) {
    std::vector<std::shared_ptr<Device>> used;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failed.isOk()) failed = why;
      for (const std::weak_ptr<Device>& d : devices) {
        if (std::shared_ptr<Device> live = d.lock()) used.push_back(std::move(live));
      }
    }
    for (Transport* t : transports()) t->abort(why);
    for (const std::shared_ptr<Device>& d : used) d->abort(why);
    workBell.ring();
    watchCv.notify_all();
  }
  // A device call starts: its device is aborted with the communicator from now on.
  void rememberDevice(const std::shared_ptr<Device>& device);
  // A device call's work is queued: the watchdog watches its end fence (and records its time
  // from `started` to the fence, where the cost model priced it).
  void watchDevice(const detail::QueuedCall& call, std::shared_ptr<Fence> end,
                   Clock::time_point started);

  std::shared_ptr<Task> submit(OpFingerprint fingerprint, detail::CallArgs args,
                               const Status& invalid);
  // Adds a finished call's measured time beside the cost model's prediction: the call ran on
  // `algorithm` with codec `codecId` (OpFingerprint::codec).
  void recordTiming(const detail::AlgorithmRow* algorithm, uint8_t codecId,
                    double predictedSeconds, double seconds) {
    const size_t row = static_cast<size_t>(algorithm - detail::algorithmTable().data());
    std::lock_guard<std::mutex> lock(timingMu);
    CommStats::Timing& t = timings[{row, codecId}];
    if (t.what.empty()) {
      t.what = std::string(opTypeName(algorithm->op)) + "/" + algorithm->name +
               (codecId != 0 ? std::string("/") + kCodecNames[codecId] : "");
    }
    ++t.calls;
    t.predictedSeconds += predictedSeconds;
    t.measuredSeconds += seconds;
    // A profile of other links (the network changed, or a copied file) shows as drift.
    if (t.calls == kDriftCalls && !driftWarned) {
      const double ratio = t.measuredSeconds / std::max(t.predictedSeconds, 1e-9);
      if (ratio > kDriftRatio || ratio < 1 / kDriftRatio) {
        driftWarned = true;
        NANOCCL_WARN(who() << t.what << " took " << ratio << "x the cost model's prediction over "
                           << t.calls << " calls: the link profile (measured "
                           << profile->measured << ") may not be of these links; run "
                           << "nanoccl-tune again or set NANOCCL_TUNING=measure");
      }
    }
  }
  static constexpr uint64_t kDriftCalls = 32;
  static constexpr double kDriftRatio = 3;
  bool driftWarned = false;  // under timingMu
  // Sets args.codec where the call is to be compressed: `request` from allreduceCompressed or
  // reduceScatterCompressed, else the config's codec for calls of at least
  // compressionMinBytes. An explicit request the call cannot honour (dtype, reduction) is an
  // argument error.
  Status chooseCodec(detail::CallArgs& args, const CompressionRequest* request) const;
  void workerLoop();
  // The queue whose head runs next (mu held): the innermost scope's, or the main queue where
  // there is no scope; null while an open scope with no call holds every call back. Drops the
  // scopes that are closed and have no call left. After a failure, or while stopping, order no
  // longer matters: any queue with a call.
  std::deque<detail::QueuedCall>* nextQueue();
  // Whether any call is queued, held back or not (mu held).
  bool anyQueued() const;
  // The head of nextQueue(), marked running and given its sequence number (mu held, nextQueue()
  // has a call).
  detail::QueuedCall takeNext();
  // The queued call (held back or not) with the earliest deadline, or null (mu held). While
  // scopes hold calls back, a call held past its deadline fails the communicator (workerLoop).
  const detail::QueuedCall* earliestQueued() const;
  // What `first` (earliestQueued()), held past its deadline, fails the communicator with.
  Status heldTooLong(const detail::QueuedCall& first) const;
  // Runs (or, after a failure, fails) a call from takeNext(), on the worker or on a caller
  // (Task::runHere), then clears `running`.
  void runTaken(detail::QueuedCall& call);
  void runCall(detail::QueuedCall& call);
  // Ends the running call's turn (clears `running`) and hands the next one to the worker;
  // first opens `scope` (non-null: the call's completion runs user code, ScopeRequest).
  void finishTurn(const std::shared_ptr<CallScope>& scope = nullptr, uint64_t seq = 0);
  // Communicator::handOver().
  void handOver();
  // Sets handOverNow where calls are queued (mu held); returns whether the worker must be woken.
  bool markHandOver();
  std::shared_ptr<Task> postP2p(bool isSend, void* buf, size_t count, DataType dtype, int peer,
                                uint32_t tag);
  void finishP2p(uint64_t id, const Status& status, int source);
  void watchdogLoop();
  // Fails what is pending, joins the threads, closes the transport. Not on a thread it joins.
  void shutdown();
};

}  // namespace nanoccl
