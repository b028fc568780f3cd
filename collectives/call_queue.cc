// The queue of collectives and the worker that runs them: Task, CallScope and ScopeRequest,
// Impl::submit, the worker's loop and its hand-over to callers (Task::runHere), runCall and the
// codec choice (chooseCodec). Point-to-point calls and the watchdog are in watchdog.cc.
#include "collectives/communicator.h"

#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "collectives/algorithm.h"
#include "collectives/communicator_impl.h"
#include "collectives/planner.h"
#include "common/logging.h"

namespace nanoccl {

using detail::CallArgs;
using detail::completeTask;
using detail::QueuedCall;
using detail::sizeText;

// ---- Task ----

bool Task::test() const { return done_.done(); }

Status Task::wait(const Deadline& deadline) const {
  runHere(deadline);
  if (!done_.wait(deadline)) {
    return timeoutError("the task did not complete before the caller's deadline");
  }
  return done_.status();
}

void Task::runHere(const Deadline& waiter) const {
  if (done_.done()) return;
  if (std::shared_ptr<Communicator> owner = owner_.lock()) owner->runIfNext(*this, waiter);
}

Status Task::status() const { return done_.status(); }

void Task::onComplete(std::function<void(const Status&)> cb) {
  done_.onComplete([cb = std::move(cb)](const Status& s, int) { cb(s); });
}

int Task::source() const { return done_.source(); }

// A timed-out p2p request may still be called back after the abort: the first completion wins.
void Task::complete(const Status& status, int source) { done_.complete(status, source); }

// ---- Communicator ----

namespace {

// The worker's hand-over (workerLoop). A blocking call is run by its caller (Task::runHere);
// waking the worker for it anyway costs a wake-up on another core, about 20 us per 4-byte
// allreduce on the project's 2-core VM (measured), more than the rest of the call. So submit()
// does not wake the worker for a lone call: it sets the worker's alarm (AlarmBell) to kTick after
// the call's issue instead, and the worker starts the call then if nobody has. Each call moves
// the alarm on (where it would go off within kTick / 2, so that calls made back to back set
// the timer once every few milliseconds, not each), so the worker sleeps while calls are made
// and run by their callers, and wakes once after they stop. (Waking every kTick while calls
// were being made took the CPU from a caller spinning on a call in flight: one slow call a
// tick.) A caller that will not wait on the Task says so
// (Communicator::handOver: the torch Work does on getFuture() and isCompleted()), as do a
// second call and a point-to-point call: those wake the worker at once. Any other call nobody
// waits on starts within kTick. (A 1 ms tick measured up to 2x slower back-to-back: each
// wake-up costs.)
constexpr auto kTick = std::chrono::milliseconds(10);

// The scope calls issued on this thread join (CallScope::Enter), or null.
thread_local CallScope* tlsScope = nullptr;
// The ScopeRequest of this thread's next collective, or null; submit() takes its query.
thread_local std::function<bool()>* tlsScopeRequest = nullptr;

bool sameOwner(const std::weak_ptr<Communicator>& a, const std::weak_ptr<Communicator>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

}  // namespace

// ---- CallScope ----

void CallScope::close() {
  if (std::shared_ptr<Communicator> owner = owner_.lock()) owner->closeScope(this);
}

CallScope::Enter::Enter(std::shared_ptr<CallScope> scope)
    : scope_(std::move(scope)), previous_(tlsScope) {
  if (scope_) tlsScope = scope_.get();
}

CallScope::Enter::~Enter() { tlsScope = previous_; }

ScopeRequest::ScopeRequest(std::function<bool()> want) : want_(std::move(want)) {
  tlsScopeRequest = &want_;
}

ScopeRequest::~ScopeRequest() { tlsScopeRequest = nullptr; }

void Communicator::closeScope(const CallScope* scope) {
  Impl& im = *impl_;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    for (detail::ScopeQueue& q : im.scopes) {
      if (q.scope == scope && q.open) {
        q.open = false;
        wake = !im.running && im.anyQueued();
      }
    }
  }
  if (wake) im.workBell.ring();
}

// Communicator::Impl itself (its members, its threads and what `mu` guards) is in
// communicator_impl.h.

std::shared_ptr<Task> Communicator::Impl::submit(OpFingerprint fingerprint, CallArgs args,
                                                 const Status& invalid) {
  const Clock::time_point issued = Clock::now();
  const Deadline deadline = Deadline::from(issued, timeout);  // from the issue, queued or not
  auto task = std::make_shared<Task>();
  // Built only for an error: a 4-byte call takes a few microseconds, strings count.
  auto call = [&] {
    return who() + opTypeName(fingerprint.op) + " (" +
           sizeText(fingerprint.dtype, fingerprint.count) + "): ";
  };
  // Argument errors fail this call only: nothing was sent and no sequence number was used,
  // so the communicator stays usable (ranks that all make the same mistake stay in step).
  if (!invalid.isOk()) {
    task->complete(invalidArgument(call() + invalid.message()));
    return task;
  }
  Result<detail::Plan> plan = detail::plan(args, topology, config, profile.get());
  if (!plan.isOk()) {
    task->complete(Status(plan.status().code(), call() + plan.status().message()));
    return task;
  }
  args.codec = plan.value().codec;
  args.codecParams = plan.value().codecParams;
  args.codecChunkBytes = plan.value().codecChunkBytes;
  args.chunkBytes = plan.value().chunkBytes;
  args.lanes = plan.value().lanes;
  if (!plan.value().row->lossy || args.codec == nullptr) {
    // e.g. NANOCCL_ALGO=ring: lossless, the residual untouched
    args.codec = nullptr;
    args.residual = nullptr;
  }
  fingerprint.codec = args.codec != nullptr ? static_cast<uint8_t>(args.codec->id) : 0;
  fingerprint.lanes = static_cast<uint8_t>(args.lanes);
  bool wake;
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!failed.isOk() || stopping) {
      fingerprint.seq = nextSeq++;  // the number it would have had: order no longer matters
      const Status s =
          laterFailure(who() + fingerprint.describe() + ": ",
                       failed.isOk() ? abortedError("communicator destroyed") : failed);
      lock.unlock();
      task->complete(s);
      return task;
    }
    task->owner_ = self;
    if (tlsScopeRequest != nullptr && *tlsScopeRequest) {
      task->holdQuery_ = std::move(*tlsScopeRequest);
      *tlsScopeRequest = nullptr;
    }
    // Issued inside a scope of this communicator (a callback of one of its calls): the call
    // goes before every call not yet started outside the scope (CallScope).
    std::deque<QueuedCall>* into = &queue;
    if (tlsScope != nullptr && sameOwner(tlsScope->owner_, self)) {
      for (detail::ScopeQueue& sq : scopes) {
        if (sq.scope == tlsScope && sq.open) into = &sq.calls;
      }
    }
    into->push_back(QueuedCall{task, issued, deadline, fingerprint, std::move(args),
                               plan.value().row, plan.value().predictedSeconds});
    // Whoever runs the current call hands this one on (workerLoop, finishTurn). A lone call
    // on an idle communicator is probably waited on next, and then run by its caller
    // (Task::runHere): the worker's alarm starts it if not (kTick says why it is not woken).
    // NANOCCL_SPIN_US=0 leaves nothing to the caller.
    const bool leftToCaller =
        into->size() == 1 && handOverGrace.count() > 0 && nextQueue() == into;
    wake = !running && !leftToCaller;
    if (leftToCaller && alarmAt < issued + kTick / 2) {
      alarmAt = issued + kTick;
      workBell.setAlarm(alarmAt);  // under `mu`: two callers' alarms cannot cross
    }
  }
  if (wake) workBell.ring();
  return task;
}

void Communicator::Impl::workerLoop() {
  for (;;) {
    QueuedCall call;
    Status held;  // a call held behind a scope past its deadline
    {
      std::unique_lock<std::mutex> lock(mu);
      for (;;) {
        // A caller may be running the head call itself (Task::runHere): its turn ends first.
        Clock::time_point sleepUntil = Clock::time_point::max();
        std::deque<QueuedCall>* next = running ? nullptr : nextQueue();
        if (next != nullptr && !next->empty()) {
          // A lone fresh call is left to its caller for a moment (NANOCCL_SPIN_US).
          const Clock::time_point leftUntil = next->front().issued + handOverGrace;
          if (stopping || handOverNow || next->size() > 1 || Clock::now() >= leftUntil) break;
          sleepUntil = leftUntil;
        } else if (!running && next == nullptr) {
          // Held behind an open scope: its callbacks may still issue calls that go first.
          const QueuedCall* first = earliestQueued();
          if (first != nullptr && first->deadline.expired()) {
            held = heldTooLong(*first);
            break;
          }
          if (first != nullptr) sleepUntil = first->deadline.at();
        } else if (stopping && !running) {
          return;
        }
        // Until rung, or the alarm goes off (submit(), kTick), or the grace above ends.
        lock.unlock();
        workBell.sleep(sleepUntil);
        lock.lock();
      }
      if (held.isOk()) call = takeNext();
    }
    if (!held.isOk()) {
      NANOCCL_WARN(held.toString());
      fail(held);  // then every queued call fails in turn, in any order
      continue;
    }
    runTaken(call);
  }
}

std::deque<QueuedCall>* Communicator::Impl::nextQueue() {
  while (!scopes.empty() && !scopes.back().open && scopes.back().calls.empty()) {
    scopes.pop_back();
  }
  if (failed.isOk() && !stopping) {
    if (scopes.empty()) return &queue;
    return scopes.back().calls.empty() ? nullptr : &scopes.back().calls;
  }
  for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
    if (!it->calls.empty()) return &it->calls;
  }
  return &queue;
}

bool Communicator::Impl::anyQueued() const {
  if (!queue.empty()) return true;
  for (const detail::ScopeQueue& q : scopes) {
    if (!q.calls.empty()) return true;
  }
  return false;
}

const QueuedCall* Communicator::Impl::earliestQueued() const {
  const QueuedCall* first = nullptr;
  auto consider = [&](const std::deque<QueuedCall>& q) {
    for (const QueuedCall& c : q) {
      if (first == nullptr || c.deadline.at() < first->deadline.at()) first = &c;
    }
  };
  consider(queue);
  for (const detail::ScopeQueue& q : scopes) consider(q.calls);
  return first;
}

Status Communicator::Impl::heldTooLong(const QueuedCall& first) const {
  uint64_t holder = 0;
  for (const detail::ScopeQueue& q : scopes) {
    if (q.open) holder = q.call;
  }
  const OpFingerprint& fp = first.fingerprint;
  return timeoutError(who() + opTypeName(fp.op) + " (" + sizeText(fp.dtype, fp.count) + ")" +
                      " did not start within the timeout of " +
                      std::to_string(timeout.count()) +
                      " ms: it waited for the callbacks of call #" + std::to_string(holder) +
                      " (a Future callback of that call, e.g. its `then`) to return, and they "
                      "have not; a callback must not wait on a call issued outside it after "
                      "that call (it would wait on itself)");
}

QueuedCall Communicator::Impl::takeNext() {
  std::deque<QueuedCall>& from = *nextQueue();
  QueuedCall call = std::move(from.front());
  from.pop_front();
  call.fingerprint.seq = nextSeq++;
  running = true;
  if (!anyQueued()) handOverNow = false;
  return call;
}

void Communicator::Impl::runTaken(QueuedCall& call) {
  Status first;
  {
    std::lock_guard<std::mutex> lock(mu);
    first = failed;
  }
  if (!first.isOk()) {
    finishTurn();
    completeTask(*call.task, laterFailure(who() + call.fingerprint.describe() + ": ", first));
    return;
  }
  runCall(call);
}

void Communicator::Impl::finishTurn(const std::shared_ptr<CallScope>& scope, uint64_t seq) {
  bool more;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (scope) scopes.push_back(detail::ScopeQueue{scope.get(), seq, true, {}});
    running = false;
    more = anyQueued();
  }
  // The worker waits for the turn only where a caller ran this call (Task::runHere) while
  // more were queued; an idle worker is not woken for nothing.
  if (more) workBell.ring();
}

void Communicator::handOver() { impl_->handOver(); }

void Communicator::Impl::handOver() {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu);
    wake = markHandOver();
  }
  if (wake) workBell.ring();
}

bool Communicator::Impl::markHandOver() {
  if (!anyQueued() || handOverNow) return false;
  handOverNow = true;
  return !running;  // whoever runs the current call hands the queue on
}

void Communicator::runIfNext(const Task& task, const Deadline& waiter) {
  Impl& im = *impl_;
  QueuedCall call;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    if (im.running || im.stopping) return;
    std::deque<QueuedCall>* next = im.nextQueue();
    if (next == nullptr || next->empty() || next->front().task.get() != &task) return;
    if (waiter.at() < next->front().deadline.at()) {
      // Run here, the call could hold the caller past its own deadline.
      wake = im.markHandOver();
    } else {
      call = im.takeNext();
    }
  }
  if (wake) {
    im.workBell.ring();
    return;
  }
  if (call.task) im.runTaken(call);
}

void Communicator::Impl::runCall(QueuedCall& call) {
  auto what = [&] { return who() + call.fingerprint.describe() + ": "; };  // for errors, traces
  Status s;
  std::shared_ptr<Fence> deviceEnd;  // a device call's (Task::deviceEnd)
  {
    // The deadline counts from the issue, not from now: time spent queued behind earlier
    // calls counts.
    detail::Context ctx(transport.get(), rank, size, call.fingerprint, call.deadline, timeout,
                        config, hierarchy.get(), &scratchPool);
    ctx.setCodecChunkBytes(call.args.codecChunkBytes);
    ctx.setChunkBytes(call.args.chunkBytes);
    NANOCCL_TRACE(what() << "running " << (size == 1 ? "local" : call.algorithm->name));
    const Clock::time_point started = Clock::now();
    if (call.args.device) {
      rememberDevice(call.args.device);  // aborted with the communicator from now on
      s = detail::runDeviceCall(ctx, call.args, *call.algorithm, &deviceEnd);
    } else {
      s = size == 1 ? detail::runLocal(call.args) : call.algorithm->run(ctx, call.args);
    }
    if (s.isOk() && deviceEnd) watchDevice(call, deviceEnd, started);
    if (s.isOk() && size > 1 && call.predictedSeconds != detail::kNoPrediction &&
        !call.args.device) {
      const double took = std::chrono::duration<double>(Clock::now() - started).count();
      recordTiming(call.algorithm, call.fingerprint.codec, call.predictedSeconds, took);
    }
    // Stages on the hierarchy's groups count here too (child Contexts add to ctx).
    const auto op = static_cast<size_t>(call.fingerprint.op);
    sentPerOp[op] += ctx.bytesSent();
    receivedPerOp[op] += ctx.bytesReceived();
    if (size > 1 || call.args.device) ++callsPerRow[call.algorithm - detail::algorithmTable().data()];
    if (!s.isOk()) {
      s = Status(s.code(), what() + s.message());
      NANOCCL_WARN(s.toString());
      // Before ctx (and its scratch memory) goes away: requests that are still pending must
      // not write into freed memory, and the peers must stop waiting for this rank.
      fail(s);  // aborts the call's device too (rememberDevice): its queued work ends
      keepLeftover(ctx.takeUnfinished(), *call.task, s);
    }
  }
  ++calls;
  // A completion that runs user code (a torch future's callbacks) gets a scope before any
  // later call can start, so that the calls it issues keep their place (CallScope).
  std::shared_ptr<CallScope> scope;
  if (s.isOk() && call.task->holdQuery_ && call.task->holdQuery_()) {
    scope = std::make_shared<CallScope>();
    scope->owner_ = self;
    call.task->scope_ = scope;
  }
  call.task->holdQuery_ = nullptr;
  if (s.isOk()) call.task->deviceEnd_ = std::move(deviceEnd);
  finishTurn(scope, call.fingerprint.seq);
  completeTask(*call.task, s);
}

Status Communicator::Impl::chooseCodec(CallArgs& args, const CompressionRequest* request) const {
  const std::string& name = request != nullptr ? request->codec : config.compression;
  if (name == "none" || (request == nullptr && args.planBytes() < config.compressionMinBytes)) {
    return Status::ok();
  }
  // float16/bfloat16 cross nodes in float32 (hierarchical.cc; runInFloat32 on the flat rows).
  const bool floatSum =
      (args.dtype == DataType::kFloat32 || args.dtype == DataType::kFloat16 ||
       args.dtype == DataType::kBFloat16) &&
      (args.redop == ReduceOp::kSum || args.redop == ReduceOp::kAvg ||
       args.redop == ReduceOp::kPremulSum);
  if (!floatSum) {
    if (request == nullptr) return Status::ok();  // integers, MIN, MAX...: lossless
    return invalidArgument(std::string("compressed ") + opTypeName(args.op) +
                           " takes float32, float16 or bfloat16 with sum, avg or premul_sum, "
                           "got " +
                           dataTypeName(args.dtype) + " with " + reduceOpName(args.redop));
  }
  if (name == "auto" && request == nullptr) {  // the planner picks from compression_allow
    args.codecAuto = topology.numNodes() >= 2 && size >= 2;
    return Status::ok();
  }
  NANOCCL_ASSIGN_OR_RETURN(const codec::Codec* c, codec::findCodec(name));
  codec::CodecParams params;
  params.blockSize = request != nullptr && request->blockSize != 0
                         ? request->blockSize
                         : static_cast<uint32_t>(config.compressionBlock);
  NANOCCL_CHECK(codec::resolveBlockSize(*c, params).status());
  if (topology.numNodes() < 2 || size < 2) return Status::ok();  // no inter-node leg
  args.codec = c;
  args.codecParams = params;
  if (request != nullptr) args.residual = request->residual;
  return Status::ok();
}

}  // namespace nanoccl
