// The Communicator's machinery: Task, the worker that runs the queued collectives (submit,
// workerLoop, runCall), the codec choice, point-to-point calls and their watchdog, and create,
// shutdown and stats. Communicator::Impl is defined in communicator_impl.h; the public calls,
// which validate their arguments and queue, are in calls.cc.
#include "collectives/communicator.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <thread>

#include "collectives/algorithm.h"
#include "collectives/communicator_impl.h"
#include "collectives/connect.h"
#include "collectives/cost_model.h"
#include "collectives/planner.h"
#include "common/crypto.h"
#include "common/logging.h"
#include "common/secret.h"
#include "common/thread_name.h"
#include "transports/routed/routed_transport.h"

namespace nanoccl {

using detail::AlgorithmRow;
using detail::CallArgs;
using detail::kNumOpTypes;
using detail::P2pCall;
using detail::QueuedCall;
using detail::validDataType;

namespace {

// The last step of setup: the store's last reads of creation are done on every rank before
// rank 0 returns. Where rank 0 hosts the store (env:// without torchrun), a rank 0 that
// returned and exited at once would take it away from ranks still reading it.
Status leaveStoreTogether(Store& store, int rank, int size, const Deadline& deadline) {
  if (rank != 0) {
    (void)store.set("setup/done/" + std::to_string(rank), "1");  // rank 0 times out without it
    return Status::ok();
  }
  for (int r = 1; r < size; ++r) {
    Result<std::string> done = store.get("setup/done/" + std::to_string(r), deadline);
    if (!done.isOk()) {
      return done.status().withContext("waiting for rank " + std::to_string(r) +
                                       " to finish its setup: ");
    }
  }
  return Status::ok();
}

// The secret this communicator's connections prove they hold (common/secret.h), after every
// rank has said where it comes from: a rank with NANOCCL_SECRET_FILE beside one
// without would otherwise only see its peers' handshakes fail.
Result<std::string> agreeOnJobSecret(Store& store, const CommunicatorOptions& options,
                                  const Deadline& deadline) {
  NANOCCL_ASSIGN_OR_RETURN(JobSecret js, loadOutOfBandSecret(options.config));
  const std::string mine = js.outOfBand ? "out of band" : "the store";
  NANOCCL_CHECK(store.set("auth/" + std::to_string(options.rank), mine));
  for (int r = 0; r < options.size; ++r) {
    Result<std::string> theirs = store.get("auth/" + std::to_string(r), deadline);
    if (!theirs.isOk()) {
      return theirs.status().withContext("waiting for rank " + std::to_string(r) +
                                         "'s secret mode: ");
    }
    if (theirs.value() != mine) {
      return mismatchError("rank " + std::to_string(r) + " takes the job secret from " +
                           theirs.value() + ", rank " + std::to_string(options.rank) + " from " +
                           mine + ": set NANOCCL_SECRET_FILE (or NANOCCL_SECRET) on every rank "
                           "or on none");
    }
  }
  if (!js.outOfBand) {
    std::string secret(crypto::kKeyBytes, '\0');
    if (options.rank == 0) {
      NANOCCL_CHECK(crypto::randomBytes(secret.data(), secret.size()));
      NANOCCL_CHECK(store.set("secret", secret));
    } else {
      Result<std::string> got = store.get("secret", deadline);
      if (!got.isOk()) return got.status().withContext("waiting for rank 0's secret: ");
      secret = std::move(got).value();
    }
    js.bytes = std::move(secret);
  }
  NANOCCL_INFO("rank " << options.rank << ": communicator '" << options.commId
                       << "': job secret from " << js.where
                       << (js.outOfBand ? " (nothing secret in the store)"
                                        : " (readable by anyone who can reach the store; set "
                                          "NANOCCL_SECRET_FILE to keep it out)")
                       << "; handshakes prove it by HMAC challenge-response; TCP encryption "
                       << (options.config.encrypt ? "on (AES-256-GCM)" : "off"));
  return std::move(js.bytes);
}

std::string sizeText(DataType dtype, size_t count) {
  return std::string(dataTypeName(dtype)) + " x " + std::to_string(count);
}

}  // namespace

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

// Non-zero while this thread runs Task callbacks: a communicator destroyed from inside one
// (its last reference dropped there) may be running on one of its own threads, which cannot
// join themselves.
thread_local int tlsInCallbacks = 0;

void completeTask(Task& task, const Status& status, int source = -1) {
  ++tlsInCallbacks;
  task.complete(status, source);
  --tlsInCallbacks;
}

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

Result<std::shared_ptr<Communicator>> Communicator::create(const CommunicatorOptions& options) {
  if (!options.store) return invalidArgument("communicator: no store given");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return invalidArgument("communicator: rank " + std::to_string(options.rank) +
                           " is not in a world of size " + std::to_string(options.size));
  }
  if (options.timeout.count() <= 0) return invalidArgument("communicator: timeout must be > 0");
  // Checked before anything is set up, on every rank alike (same table, same settings).
  Result<TransportChoice> choice = chooseTransports(options.config);
  if (!choice.isOk()) {
    return choice.status().withContext("rank " + std::to_string(options.rank) + ": ");
  }
  NANOCCL_CHECK(detail::checkAlgorithmName(options.config.algo)
                    .withContext("rank " + std::to_string(options.rank) + ": "));

  auto impl = std::make_unique<Impl>();
  NANOCCL_CHECK(impl->workBell.open().withContext("rank " + std::to_string(options.rank) +
                                                  ": communicator: the worker's alarm bell: "));
  impl->rank = options.rank;
  impl->size = options.size;
  impl->commId = options.commId;
  impl->config = options.config;
  if (impl->config.compression == "auto" && impl->config.tuning == "off") {
    impl->config.tuning = "cached";  // the codec is chosen from the link profile
  }
  impl->timeout = options.timeout;
  impl->handOverGrace = std::chrono::microseconds(options.config.spinUs);
  impl->callsPerRow = std::make_unique<std::atomic<uint64_t>[]>(detail::algorithmTable().size());
  const std::string nodeId = !options.config.nodeId.empty() ? options.config.nodeId
                             : !options.nodeId.empty()      ? options.nodeId
                                                            : defaultNodeId();
  impl->topology = Topology::fromNodeIds({nodeId});

  if (options.size > 1) {
    const std::string where =
        "rank " + std::to_string(options.rank) + ": communicator '" + options.commId + "' setup: ";
    auto store = std::make_shared<PrefixStore>("nanoccl/" + options.commId, options.store);
    const Deadline deadline = Deadline::after(options.timeout);
    Result<std::string> secret = agreeOnJobSecret(*store, options, deadline);
    if (!secret.isOk()) return secret.status().withContext(where);

    NANOCCL_CHECK(store->set("node/" + std::to_string(options.rank), nodeId).withContext(where));
    std::vector<std::string> nodeIds(options.size);
    for (int r = 0; r < options.size; ++r) {
      Result<std::string> id = store->get("node/" + std::to_string(r), deadline);
      if (!id.isOk()) {
        return id.status().withContext(where + "waiting for rank " + std::to_string(r) +
                                       "'s node id: ");
      }
      nodeIds[r] = std::move(id).value();
    }
    impl->topology = Topology::fromNodeIds(std::move(nodeIds));

    Result<std::unique_ptr<Transport>> transport = detail::connectMain(
        options, choice.value(), impl->topology, secret.value(), deadline, &impl->routed);
    if (!transport.isOk()) return transport.status().withContext(where);
    impl->transport = std::move(transport).value();
    impl->transportKind = choice.value().interNode;

    if (impl->topology.hierarchical()) {
      Result<std::unique_ptr<detail::Hierarchy>> h =
          detail::connectHierarchy(options, choice.value(), impl->topology,
                                   impl->transport.get(), secret.value(), deadline);
      if (!h.isOk()) return h.status().withContext(where);
      impl->hierarchy = std::move(h).value();
    }

    TuningTarget target;
    target.rank = options.rank;
    target.size = options.size;
    target.topology = &impl->topology;
    target.config = &impl->config;
    target.main = impl->transport.get();
    target.hierarchy = impl->hierarchy.get();
    target.transport = impl->transportKind;
    target.timeout = options.timeout;
    Result<std::shared_ptr<const LinkProfile>> profile = agreeOnProfile(*store, target, deadline);
    // Also after a failed agreement: the others may still be reading rank 0's verdict.
    const Status left = leaveStoreTogether(*store, options.rank, options.size, deadline);
    if (!profile.isOk()) return profile.status().withContext(where);
    NANOCCL_CHECK(left.withContext(where));
    impl->profile = std::move(profile).value();
  }

  impl->config.logOnce();
  std::string over = impl->transport ? " over " + impl->transport->describe() : "";
  if (const detail::Hierarchy* h = impl->hierarchy.get()) {
    over += "; " + impl->topology.describe();
    if (h->cross.own) over += ", inter-node stage over " + h->cross.own->describe();
  }
  NANOCCL_INFO("rank " << options.rank << "/" << options.size << ": communicator '"
                       << options.commId << "' ready" << over);
  Impl* raw = impl.get();
  impl->worker = namedThread("worker", [raw] { raw->workerLoop(); });
  std::shared_ptr<Communicator> comm(new Communicator(std::move(impl)));
  raw->self = comm;
  return comm;
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator::~Communicator() {
  if (tlsInCallbacks > 0) {
    // Possibly on this communicator's worker, watchdog or progress thread: hand the teardown
    // to a short-lived thread that can join them all.
    namedThread("destroy", [impl = impl_.release()] {
      impl->shutdown();
      delete impl;
    }).detach();
    return;
  }
  impl_->shutdown();
}

void Communicator::Impl::shutdown() {
  const Status destroyedStatus = abortedError("communicator destroyed");
  bool pending;
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = true;
    pending = anyQueued() || running || !p2p.empty();
    if (pending) {
      destroyed = failed.isOk();
      if (failed.isOk()) failed = destroyedStatus;
    }
  }
  // Only a communicator with work in flight aborts (and so tells its peers); an idle one just
  // closes its connections below.
  if (pending) {
    for (Transport* t : transports()) t->abort(destroyedStatus);
  }
  workBell.ring();
  watchCv.notify_all();
  if (worker.joinable()) worker.join();
  if (watchdog.joinable()) watchdog.join();
  hierarchy.reset();
  transport.reset();
  kept->release();  // no transport is left to target what failed calls kept
  std::map<uint64_t, P2pCall> left;
  {
    std::lock_guard<std::mutex> lock(mu);
    left.swap(p2p);
  }
  for (auto& [id, call] : left) {
    call.task->complete(abortedError(call.what + ": communicator destroyed"));
  }
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
const Config& Communicator::config() const { return impl_->config; }
const Topology& Communicator::topology() const { return impl_->topology; }
std::shared_ptr<const LinkProfile> Communicator::linkProfile() const { return impl_->profile; }

void Communicator::abort(const Status& why) {
  impl_->fail(why.isOk()
                  ? abortedError("rank " + std::to_string(impl_->rank) + ": communicator aborted")
                  : why);
}

namespace {

// Adds `from` to `into` element by element (growing it).
template <typename T>
void addEach(std::vector<T>& into, const std::vector<T>& from) {
  if (into.size() < from.size()) into.resize(from.size());
  for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
}

// Adds `from`'s entries to `into`'s of the same name (`nameOf`), appending new ones in order.
template <typename T, typename Name, typename Add>
void addByName(std::vector<T>& into, const std::vector<T>& from, Name nameOf, Add add) {
  for (const T& e : from) {
    auto it = std::find_if(into.begin(), into.end(),
                           [&](const T& x) { return nameOf(x) == nameOf(e); });
    if (it == into.end()) {
      into.push_back(e);
    } else {
      add(*it, e);
    }
  }
}

}  // namespace

CommStats& CommStats::operator+=(const CommStats& o) {
  addEach(perPeer, o.perPeer);
  addEach(bytesSentPerOp, o.bytesSentPerOp);
  addEach(bytesReceivedPerOp, o.bytesReceivedPerOp);
  calls += o.calls;
  intraNodeBytesSent += o.intraNodeBytesSent;
  intraNodeBytesReceived += o.intraNodeBytesReceived;
  interNodeBytesSent += o.interNodeBytesSent;
  interNodeBytesReceived += o.interNodeBytesReceived;
  const auto first = [](const auto& e) -> const std::string& { return e.first; };
  addByName(callsPerAlgorithm, o.callsPerAlgorithm, first,
            [](auto& a, const auto& b) { a.second += b.second; });
  addByName(perTransport, o.perTransport, first,
            [](auto& a, const auto& b) { a.second += b.second; });
  addRails(perRail, o.perRail);
  addByName(modelled, o.modelled, [](const Timing& t) -> const std::string& { return t.what; },
            [](Timing& a, const Timing& b) {
              a.calls += b.calls;
              a.predictedSeconds += b.predictedSeconds;
              a.measuredSeconds += b.measuredSeconds;
            });
  callsWithKeptBuffers += o.callsWithKeptBuffers;
  return *this;
}

CommStats Communicator::stats() const {
  CommStats s;
  s.rank = impl_->rank;
  s.size = impl_->size;
  s.nodes = impl_->topology.nodeIds;
  s.callsWithKeptBuffers = impl_->callsWithKeptBuffers.load();
  s.perPeer =
      impl_->transport ? impl_->transport->counters() : std::vector<PeerCounters>(impl_->size);
  s.bytesSentPerOp.resize(kNumOpTypes);
  s.bytesReceivedPerOp.resize(kNumOpTypes);
  for (size_t i = 0; i < kNumOpTypes; ++i) {
    s.bytesSentPerOp[i] = impl_->sentPerOp[i].load();
    s.bytesReceivedPerOp[i] = impl_->receivedPerOp[i].load();
  }
  s.calls = impl_->calls.load();

  // A transport's counters, summed under its name and, peer by peer, under `ranks` (the
  // parent ranks of its members: a cross group's own) or its own.
  const auto traffic = [&](const std::string& name, const std::vector<PeerCounters>& c,
                           const std::vector<int>* ranks) {
    CommStats t;
    t.perTransport.push_back({name, PeerCounters{}});
    if (ranks != nullptr) t.perPeer.resize(static_cast<size_t>(impl_->size));
    for (size_t i = 0; i < c.size(); ++i) {
      t.perTransport.back().second += c[i];
      if (ranks != nullptr && i < ranks->size()) t.perPeer[(*ranks)[i]] += c[i];
    }
    return t;
  };
  if (impl_->routed != nullptr) {
    for (const auto& [name, c] : impl_->routed->countersPerTransport()) {
      s += traffic(name, c, nullptr);
    }
  } else if (impl_->transport) {
    s += traffic(impl_->transportKind, s.perPeer, nullptr);
  }
  if (impl_->transport) addRails(s.perRail, impl_->transport->railCounters());

  // A cross group's own transport (on its own rail), under the parent ranks of its members.
  if (impl_->hierarchy && impl_->hierarchy->cross.own) {
    const detail::SubGroup& g = impl_->hierarchy->cross;
    CommStats sub = traffic(impl_->transportKind, g.own->counters(), &g.ranks);
    sub.perRail = g.own->railCounters();
    s += sub;
  }
  const Topology& topo = impl_->topology;
  for (int r = 0; r < static_cast<int>(s.perPeer.size()) && r < topo.size(); ++r) {
    if (r == impl_->rank) continue;
    const bool intra = topo.sameNode(r, impl_->rank);
    (intra ? s.intraNodeBytesSent : s.interNodeBytesSent) += s.perPeer[r].bytesSent;
    (intra ? s.intraNodeBytesReceived : s.interNodeBytesReceived) += s.perPeer[r].bytesReceived;
  }
  const std::vector<AlgorithmRow>& table = detail::algorithmTable();
  for (size_t i = 0; i < table.size(); ++i) {
    if (const uint64_t n = impl_->callsPerRow[i].load(); n > 0) {
      s.callsPerAlgorithm.emplace_back(std::string(opTypeName(table[i].op)) + "/" + table[i].name,
                                       n);
    }
  }
  {
    std::lock_guard<std::mutex> lock(impl_->timingMu);
    for (const auto& [key, t] : impl_->timings) s.modelled.push_back(t);
  }
  return s;
}

}  // namespace nanoccl
