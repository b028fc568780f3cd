#include "transports/engine.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <cstdio>
#include <map>

#include "common/logging.h"
#include "common/spin.h"
#include "common/thread_name.h"

namespace nanoccl {
namespace {

// How long stallReport() waits for progress's answer (a transport stopping may not give one).
constexpr auto kReportWait = std::chrono::milliseconds(500);
// The longest wait the progress thread asks of its mover; movers with timers wait less.
constexpr auto kMaxWait = std::chrono::microseconds(1'000'000);

}  // namespace

MatcherOptions oneOrderedLane() {
  MatcherOptions mo;
  mo.lanes = 1;
  mo.parts = [](OpType, uint64_t, uint32_t, uint64_t total, int) {
    return std::vector<Part>{{0, 0, total}};
  };
  mo.landsInOrder = true;
  return mo;
}

Status EngineRequest::wait(const Deadline& deadline) {
  if (!test()) engine_->drive([this] { return test(); });
  return BasicRequest::wait(deadline);
}

void Mover::onStop(Engine& engine, const Status& why, bool pending) { engine.fail(why, pending); }

Engine::Engine(const TransportOptions& o, EngineOptions eo, Mover& mover)
    : o_(o), eo_(eo), mover_(mover), spin_(o.config.spinUs), counters_(o.size) {}

// stop() has run (the transport's destructor calls it first): the thread has ended.
Engine::~Engine() = default;

void Engine::start(MatcherOptions mo) {
  mo.rank = o_.rank;
  mo.size = o_.size;
  mo.delivered = [this](int peer, uint64_t bytes) { counters_.received(peer, bytes); };
  matcher_.emplace(std::move(mo));
  roll_.proven.assign(static_cast<size_t>(o_.size), false);
  roll_.unproven.assign(static_cast<size_t>(o_.size), 0);
  if (o_.size > 1) thread_ = namedThread(eo_.name, [this] { progressLoop(); });
}

void Engine::stop(const Status& why) {
  if (!thread_.joinable()) return;
  post({CommandKind::kStop, nullptr, why, {}});
  thread_.join();
}

// A request's wait() polls for NANOCCL_SPIN_US before it sleeps; where the mover is drivable,
// wait() has driven progress that long already.
std::shared_ptr<Request> Engine::isend(int peer, const Envelope& env, const void* buf,
                                       size_t bytes) {
  return submit(std::make_shared<EngineRequest>(
      this, true, peer, env, const_cast<char*>(static_cast<const char*>(buf)), bytes,
      eo_.drivable ? kNoSpin : spin_));
}

std::shared_ptr<Request> Engine::irecv(int peer, const Envelope& env, void* buf, size_t bytes) {
  return submit(std::make_shared<EngineRequest>(this, false, peer, env, static_cast<char*>(buf),
                                                bytes, eo_.drivable ? kNoSpin : spin_));
}

std::shared_ptr<Request> Engine::submit(const EngineRequestPtr& req) {
  if (Status st = checkRequest(o_.rank, o_.size, *req, isOpen()); !st.isOk()) {
    req->complete(st, -1);
  } else {
    post({req->isSend ? CommandKind::kSend : CommandKind::kRecv, req, {}, {}});
  }
  return req;
}

void Engine::abort(const Status& why) {
  if (!thread_.joinable()) return;
  if (holdsProgress()) {  // from a completion callback
    fail(why, true);
    return;
  }
  post({CommandKind::kAbort, nullptr, why, {}});
  const auto bound = eo_.drainBound;
  if (drained_.wait(Deadline::after(bound))) return;
  // The progress thread has not got there (it is stuck, in a callback say).
  const bool unstuck = mover_.unstick();
  NANOCCL_WARN("rank " << o_.rank << ": " << eo_.name << ": abort found operations on callers' "
               "buffers still in flight after " << bound.count() << " ms"
               << (unstuck ? "; ending them from this thread" : ""));
  if (drained_.wait(Deadline::after(bound))) return;
  NANOCCL_WARN("rank " << o_.rank << ": " << eo_.name << ": the requests on those buffers stay "
               "pending until their operations end, so that they are not released early");
}

std::string Engine::stallReport(int peer) const {
  if (peer < 0 || peer >= o_.size || peer == o_.rank || !thread_.joinable()) return "";
  std::string out = mover_.sendStalls(peer);
  auto report = std::make_shared<std::promise<std::string>>();
  std::future<std::string> answer = report->get_future();
  const_cast<Engine*>(this)->run([this, peer, report] {  // only queues a command
    std::map<int, std::pair<uint64_t, int>> byLane;  // lane -> bytes, messages
    for (const Matcher::AwaitedLane& a : matcher_->awaitedLanes(peer)) {
      byLane[a.lane].first += a.bytes;
      ++byLane[a.lane].second;
    }
    std::string waited;
    for (const auto& [lane, w] : byLane) {
      const std::optional<Mover::LaneView> view = mover_.laneView(peer, lane);
      if (!view) continue;
      char line[100];
      std::snprintf(line, sizeof(line), ": %.2f MB still to arrive (%d message%s)",
                    w.first / 1e6, w.second, w.second == 1 ? "" : "s");
      waited += (waited.empty() ? "" : "; ") + view->label + line +
                (view->note.empty() ? "" : ", " + view->note);
    }
    report->set_value(waited);
  });
  if (answer.wait_for(kReportWait) == std::future_status::ready) {
    try {
      const std::string waited = answer.get();
      if (!waited.empty()) out += (out.empty() ? "" : "; ") + waited;
    } catch (const std::future_error&) {  // dropped unanswered: nothing to add
    }
  }
  return out.empty() ? out : out + " (is a link down?)";
}

void Engine::run(std::function<void()> fn) {
  post({CommandKind::kRun, nullptr, {}, std::move(fn)});
}

bool Engine::holdsProgress() const {
  const std::thread::id me = std::this_thread::get_id();
  return me == thread_.get_id() || driver_.load(std::memory_order_relaxed) == me;
}

void Engine::post(Command cmd) {
  if (runOnPostingThread(cmd)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(cmd));
    commandsWaiting_.store(true, std::memory_order_release);
  }
  // Without a progress thread (a world of one, or before start()) there is no wait to end,
  // and the mover may have nothing to wake with (tcp's IoEngine, fabric's queue).
  if (thread_.joinable()) mover_.wake();
}

// Runs a send or receive on the posting thread where it can (no one holds progress, no command
// is queued before it): posting then wakes no thread, and a small send is on its way before
// isend() returns. The progress thread is woken only for what is left (a send that did not
// fit): arrivals wake it themselves.
bool Engine::runOnPostingThread(const Command& cmd) {
  if (!eo_.drivable || spin_.count() <= 0 ||
      (cmd.kind != CommandKind::kSend && cmd.kind != CommandKind::kRecv) ||
      holdsProgress()) {  // a completion callback posting: its step is still running
    return false;
  }
  std::unique_lock<std::mutex> lock(progressMu_, std::try_to_lock);
  if (!lock.owns_lock() || stopping_) return false;
  {
    std::lock_guard<std::mutex> queued(mu_);
    if (!commands_.empty()) return false;  // they go first
  }
  driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  if (cmd.kind == CommandKind::kSend) {
    startSend(cmd.req);
  } else {
    startRecv(cmd.req);
  }
  driver_.store(std::thread::id(), std::memory_order_relaxed);
  const bool leftWork = mover_.sendsPending();
  lock.unlock();
  if (leftWork) mover_.wake();
  return true;
}

void Engine::drive(const std::function<bool()>& done) {
  if (!eo_.drivable || !isOpen() || holdsProgress()) return;
  Clock::time_point until = Clock::now() + spin_;
  bool leftWork = false;  // pending requests after this thread's last step
  while (!done() && Clock::now() < until) {
    std::unique_lock<std::mutex> lock(progressMu_, std::try_to_lock);
    if (lock.owns_lock()) {
      if (stopping_) return;
      driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
      const bool moved = step();
      driver_.store(std::thread::id(), std::memory_order_relaxed);
      leftWork = failed_.isOk() && hasPending();
      lock.unlock();
      if (moved) {
        // Not lastBusy_: the progress thread need not linger for a call its waiter drives.
        until = Clock::now() + spin_;
        continue;
      }
    }
    std::this_thread::yield();
  }
  // The progress thread backs off while a waiter drives: hand it what is left.
  if (leftWork) mover_.wake();
}

void Engine::progressLoop() {
  while (true) {
    mover_.arm();  // anything woken after this ends the wait below at once
    std::unique_lock<std::mutex> lock(progressMu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      // A waiter drives (drivable movers); it wakes this thread if it leaves work behind.
      // Blocking on the mutex instead would make each of its steps wake this thread.
      mover_.wait(kMaxWait);
      continue;
    }
    const bool moved = step();
    if (stopping_ && mover_.stopped()) return;
    if (moved) {
      lastBusy_ = Clock::now();
      if (eo_.drivable) continue;
    }
    const bool pending = failed_.isOk() && hasPending();
    const Clock::time_point waitStart = Clock::now();
    // A call in flight: its next event may come soon, if its recent ones did (SpinPolicy).
    // One just ended: the next of back-to-back calls may be due. Either way, poll without
    // sleeping for a while first (common/spin.h).
    const std::chrono::microseconds spin = spinBudget(pending, waitStart);
    std::chrono::microseconds wait = kMaxWait;
    if (closing_) {
      wait = std::clamp(std::chrono::ceil<std::chrono::microseconds>(closing_->until - waitStart),
                        std::chrono::microseconds(0), kMaxWait);
    }
    bool woke = false;
    // A drivable mover waits without progress held: waiters may drive meanwhile.
    if (eo_.drivable) lock.unlock();
    const auto ready = [&] {
      return (eo_.drivable ? mover_.rung() : mover_.progress()) ||
             commandsWaiting_.load(std::memory_order_acquire);
    };
    if (spin.count() > 0) woke = spinFor(spin, ready);
    if (!woke) {
      if (!commandsWaiting_.load(std::memory_order_acquire)) {
        woke = mover_.wait(wait);
      } else if (!eo_.drivable) {
        woke = mover_.progress();  // commands are due: poll once, without waiting
      }
    }
    if (pending) SpinPolicy::record(spin_, Clock::now() - waitStart);
    if (woke && !eo_.drivable) lastBusy_ = Clock::now();
  }
}

std::chrono::microseconds Engine::spinBudget(bool pending, Clock::time_point now) const {
  if (!failed_.isOk() || closing_) return kNoSpin;
  if (pending) return SpinPolicy::budget(spin_);
  return now < lastBusy_ + spin_ ? spin_ : kNoSpin;
}

bool Engine::step() {
  if (closing_ && Clock::now() >= closing_->until) {
    const Status why = std::move(closing_->why);  // fail() resets closing_
    fail(why, true);
  }
  bool moved = runCommands();
  // A drivable mover moves here (its wait() only sleeps); the others move in the progress
  // loop's spin or wait, which poll them at least once a turn: polling here too would poll
  // twice in a row.
  if (eo_.drivable && (!stopping_ || !mover_.stopped())) moved = mover_.progress() || moved;
  updateDrained();
  return moved;
}

bool Engine::runCommands() {
  std::deque<Command> cmds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cmds.swap(commands_);
    commandsWaiting_.store(false, std::memory_order_relaxed);
  }
  for (Command& cmd : cmds) execute(cmd);
  return !cmds.empty();
}

void Engine::execute(Command& cmd) {
  switch (cmd.kind) {
    case CommandKind::kSend: return startSend(cmd.req);
    case CommandKind::kRecv: return startRecv(cmd.req);
    case CommandKind::kAbort: return fail(cmd.why, true);
    case CommandKind::kRun: return cmd.fn();
    case CommandKind::kStop:
      if (stopping_) return;
      stopping_ = true;
      return mover_.onStop(*this, cmd.why, hasPending());
  }
}

void Engine::startSend(const EngineRequestPtr& req) {
  if (!failed_.isOk()) return req->complete(failed_, -1);
  req->wireSeq = matcher_->wireSeq(*req);
  mover_.startSend(req);
}

void Engine::startRecv(const EngineRequestPtr& req) {
  if (!failed_.isOk()) return req->complete(failed_, -1);
  const Status st = matcher_->postRecv(req);
  if (st.isOk()) return;
  // A lane it needs is closed: the peer's reason may still come on another.
  if (st.code() == StatusCode::kPeerError) return failSoon(st, req);
  fail(st, true);
  req->complete(failed_, -1);  // held by no table: fail() cannot see it
}

bool Engine::hasPending() const { return matcher_->hasPending() || mover_.sendsPending(); }

void Engine::fail(const Status& why, bool notifyPeers) {
  if (!failed_.isOk()) return;
  failed_ = why;
  closing_.reset();
  {
    std::lock_guard<std::mutex> lock(roll_.mu);
    roll_.failed = why;  // connect() may wait in awaitPeers()
  }
  roll_.cv.notify_all();
  // Failing with work pending is worth a warning; closing idle (a peer that finished and
  // left) is the normal end of a job.
  if (hasPending()) {
    NANOCCL_WARN("rank " << o_.rank << ": transport failed: " << why.toString());
  } else {
    NANOCCL_INFO("rank " << o_.rank << ": transport closed: " << why.toString());
  }
  // Take everything out of the tables first: callbacks run below may post new requests.
  RequestList pending = matcher_->takeAll();
  mover_.onFail(why, notifyPeers, pending);
  pending.insert(pending.end(), parked_.begin(), parked_.end());
  parked_.clear();
  std::sort(pending.begin(), pending.end());
  pending.erase(std::unique(pending.begin(), pending.end()), pending.end());
  for (auto& r : pending) {
    if (!mover_.busy(r.get())) r->complete(why, -1);
  }
  updateDrained();
}

void Engine::failSoon(const Status& why, const std::shared_ptr<BasicRequest>& parked) {
  if (!failed_.isOk()) {
    if (parked) completeIfFree(parked);
    return;
  }
  if (eo_.closeGrace.count() == 0) {
    fail(why, true);
    if (parked) completeIfFree(parked);
    return;
  }
  if (parked) parked_.push_back(parked);
  if (!closing_) closing_ = Closing{why, Clock::now() + eo_.closeGrace};
}

void Engine::completeIfFree(const std::shared_ptr<BasicRequest>& r) {
  if (r && !mover_.busy(r.get())) r->complete(failed_, -1);
  updateDrained();
}

void Engine::updateDrained() {
  if (failed_.isOk() || mover_.busy(nullptr)) return;
  drained_.complete(Status::ok());
}

void Engine::failFrom(int peer, const Status& why) {
  fail(why.withContext(me() + "from rank " + std::to_string(peer) + ": "), true);
}

void Engine::land(int peer, int lane, const FrameHeader& h, const char* data) {
  Result<Matcher::IncomingPtr> msg = matcher_->onFrame(peer, lane, h);
  if (!msg.isOk()) return fail(msg.status(), true);
  if (h.length > 0) std::memcpy(msg.value()->dest(h.offset), data, h.length);
  matcher_->landed(msg.value(), h.length);
}

void Engine::frameSent(const EngineRequestPtr& req) {
  if (--req->framesLeft > 0) return;
  counters_.sent(req->peer, req->bytes);
  req->complete(Status::ok(), o_.rank);
}

void Engine::peerFailed(int peer, std::string_view text) {
  const std::string stuck = mover_.sendStalls(peer);
  const std::string hint = " (is a link down?)";
  std::string why = me() + "rank " + std::to_string(peer) + " failed: " + std::string(text);
  if (!stuck.empty()) {
    why += "; on " + me() + stuck + (text.find(hint) == std::string_view::npos ? hint : "");
  }
  fail(peerError(why), true);
}

bool Engine::laneClosed(int peer, int lane) {
  NANOCCL_INFO(me() << "rank " << peer << " closed " << eo_.name << " lane " << lane);
  counters_.closed(peer);
  const std::shared_ptr<BasicRequest> req = matcher_->laneClosed(peer, lane);
  if (req) failSoon(matcher_->closedError(peer, *req));
  return req != nullptr;
}

Status Engine::closedPeer(int peer) const {
  return peerError(me() + "rank " + std::to_string(peer) + " closed its " + eo_.name +
                   " transport (it exited, crashed or destroyed its communicator) while rank " +
                   std::to_string(o_.rank) + " still had messages for it");
}

void Engine::proven(int peer) {
  {
    std::lock_guard<std::mutex> lock(roll_.mu);
    roll_.proven[static_cast<size_t>(peer)] = true;
  }
  roll_.cv.notify_all();
}

void Engine::unproven(int peer) {
  std::lock_guard<std::mutex> lock(roll_.mu);
  ++roll_.unproven[static_cast<size_t>(peer)];
}

Status Engine::awaitPeers(const Deadline& deadline, const std::string& hint) {
  std::unique_lock<std::mutex> lock(roll_.mu);
  waitUntil(roll_.cv, lock, deadline, [&] {
    return !roll_.failed.isOk() ||
           std::count(roll_.proven.begin(), roll_.proven.end(), true) == o_.size - 1;
  });
  if (!roll_.failed.isOk()) return roll_.failed;
  std::string missing, unproven;
  for (int p = 0; p < o_.size; ++p) {
    if (p == o_.rank || roll_.proven[p]) continue;
    missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    if (roll_.unproven[p] > 0) unproven += (unproven.empty() ? "" : ", ") + std::to_string(p);
  }
  if (missing.empty()) return Status::ok();
  return timeoutError(me() + eo_.name + " setup timed out waiting for rank(s) " + missing +
                      " to greet" +
                      (unproven.empty() ? " (" + hint + ")"
                                        : "; frames claiming to come from rank(s) " + unproven +
                                              " did not prove this job's secret (do all ranks "
                                              "use the same NANOCCL_SECRET_FILE or secret, and "
                                              "this communicator?)"));
}

// ---- EngineTransport -------------------------------------------------------------------------

Result<std::string> EngineTransport::listen() {
  if (o_.size == 1) return std::string();
  if (listened_) return invalidArgument(engine_.me() + "listen() called twice");
  NANOCCL_ASSIGN_OR_RETURN(std::string address, publish());
  listened_ = true;
  return address;
}

Status EngineTransport::connect(const std::vector<std::string>& addresses,
                                const Deadline& deadline) {
  const std::string me = engine_.me();
  if (connected_) return invalidArgument(me + "connect() called twice");
  if (o_.size > 1) {
    if (!listened_) return invalidArgument(me + "connect() before listen()");
    if (addresses.size() != static_cast<size_t>(o_.size)) {
      return invalidArgument(me + std::to_string(addresses.size()) + " addresses for " +
                             std::to_string(o_.size) + " ranks");
    }
    NANOCCL_CHECK(attach(addresses, deadline));
  }
  connected_ = true;  // a connect() refused before this may be called again
  engine_.start(matcherOptions());
  if (o_.size > 1) NANOCCL_CHECK(started(deadline));
  NANOCCL_INFO(me << describe() << " connected to " << o_.size - 1 << " peers");
  engine_.open();
  return Status::ok();
}

}  // namespace nanoccl
