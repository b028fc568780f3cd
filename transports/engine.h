// Engine: what every transport runs the same way, written once. A transport is a Mover (it
// moves bytes: sockets, rings, an endpoint) under one Engine, which owns everything else:
// - the requests: isend/irecv check them (checkRequest) and hand them to the progress thread
//   through a command queue, or, for a mover that allows it, run them on the posting thread;
// - the progress thread ("nanoccl-<name>"): commands, the mover's progress and waits, spinning
//   before sleeping while a call is in flight (common/spin.h), and threads that wait on a
//   request driving progress themselves where the mover allows it (drive());
// - the Matcher (matcher.h): receives and arriving frames meet there, never in the mover;
// - failure: fail() is the one failure path (the Matcher's requests and the mover's complete
//   with the error, the peers are told); abort() from any thread; a closed connection's grace
//   (failSoon()); the drained flag abort() waits on until no operation targets a caller's
//   buffer;
// - the counters (payload bytes and messages per peer) and the stall report's receive side.
//
// Threads
// - isend/irecv/abort/counters/stallReport: any thread. A Request's wait() may drive progress.
// - Every Mover call but wake(), arm(), rung(), a drivable mover's wait(), sendStalls() and
//   unstick() runs with the engine's progress held: on the progress thread, or on a thread
//   driving it (drivable movers only), one at a time. So the mover's state, the Matcher and the
//   Engine's progress state need no locks; completion callbacks run there too (they must not
//   block). wake(), sendStalls() and unstick() may come from any thread; arm(), rung() and a
//   drivable mover's wait() from the progress thread alone.
// - EngineTransport::connect() calls start() once the mover is attached to its peers (its own
//   setup frames move from then on) and open() once setup is through; the transport calls
//   stop() (EngineTransport::stopEngine()) first in its destructor.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/completion.h"
#include "common/deadline.h"
#include "common/status.h"
#include "transports/matcher.h"
#include "transports/request.h"
#include "transports/transport.h"

namespace nanoccl {

class Engine;

// Payload bytes and messages per peer (Transport::counters()).
class TransportCounters {
 public:
  explicit TransportCounters(int size) : c_(static_cast<size_t>(size)) {}
  std::vector<PeerCounters> snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return c_;
  }
  void sent(int peer, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    c_[static_cast<size_t>(peer)].bytesSent += bytes;
    c_[static_cast<size_t>(peer)].messagesSent += 1;
  }
  void received(int peer, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    c_[static_cast<size_t>(peer)].bytesReceived += bytes;
    c_[static_cast<size_t>(peer)].messagesReceived += 1;
  }
  void closed(int peer) {
    std::lock_guard<std::mutex> lock(mu_);
    c_[static_cast<size_t>(peer)].connectionsClosed += 1;
  }

 private:
  mutable std::mutex mu_;
  std::vector<PeerCounters> c_;
};

// A send or receive of an engine's transport; the fields are the mover's (progress held).
class EngineRequest : public BasicRequest {
 public:
  EngineRequest(Engine* engine, bool isSend, int peer, const Envelope& env, char* buf,
                size_t bytes, std::chrono::microseconds spin)
      : BasicRequest(isSend, peer, env, buf, bytes, spin), engine_(engine) {}
  // Drives the engine's progress first where its mover allows it (Engine::drive).
  Status wait(const Deadline& deadline) override;

  uint64_t wireSeq = 0;       // send: its frames' seq (Matcher::wireSeq), set before startSend
  size_t framesLeft = 0;      // send: frames not yet done
  size_t framesInFlight = 0;  // send: frames handed to the hardware or kernel, not yet done

 private:
  Engine* const engine_;
};
using EngineRequestPtr = std::shared_ptr<EngineRequest>;
using RequestList = std::vector<std::shared_ptr<BasicRequest>>;

// What a transport implements: how its bytes move (see the threads above).
class Mover {
 public:
  virtual ~Mover() = default;

  // A send the engine accepted (healthy, req->wireSeq set): queue its frames, start them.
  virtual void startSend(const EngineRequestPtr& req) = 0;
  // Moves what can move now, without waiting: completions, arrivals, queued frames, the
  // mover's own timers. Returns whether anything moved.
  virtual bool progress() = 0;
  // Waits up to `d` for something to happen. A mover that is not drivable handles what
  // happens (its completion queue) and returns whether anything moved, with progress held; a
  // drivable one only waits (without progress held) and returns whether it was woken.
  virtual bool wait(std::chrono::microseconds d) = 0;
  // Any thread: ends the current wait(), or the next one after arm().
  virtual void wake() = 0;
  // The progress thread is about to take the commands: a wake() from here on must end the
  // next wait() (shm snapshots its doorbell); and for a drivable mover, whether it was woken
  // since (rung(); polled while spinning, without progress held).
  virtual void arm() {}
  virtual bool rung() const { return false; }

  // Sends the mover holds that have not completed (queued, or in flight).
  virtual bool sendsPending() const = 0;
  // Whether an operation in flight may still read or write `r`'s buffer (r == nullptr: any
  // caller's buffer).
  virtual bool busy(const BasicRequest* r) const = 0;
  // The engine fails with `why`: stop moving, tell the peers if asked, and append to `out`
  // every request the mover holds (the engine completes those not busy(); the others complete
  // when their operation ends: the mover calls completeIfFree()).
  virtual void onFail(const Status& why, bool notifyPeers, RequestList& out) = 0;
  // The transport is being destroyed, with requests pending or not. Default: fail with `why`,
  // telling the peers only where requests were pending (idle, the transport closes in order).
  virtual void onStop(Engine& engine, const Status& why, bool pending);
  // Once stopping: whether the progress thread may end (the mover's last frames are gone).
  virtual bool stopped() const { return true; }
  // abort() waited its bound and operations still target callers' buffers: end them from this
  // thread if the mover can (tcp: shut its sockets down) and return true to wait once more.
  virtual bool unstick() { return false; }

  // The stall report (Engine::stallReport): what is stuck on the way to `peer` on the sending
  // side (any thread), and how the mover names a lane a message still needs bytes from and
  // what it sees there ({"connection 1 to rank 0", "nothing received on it for 2.1 s"};
  // nullopt leaves the lane out).
  struct LaneView {
    std::string label;
    std::string note;
  };
  virtual std::string sendStalls(int peer) const { return ""; }
  virtual std::optional<LaneView> laneView(int peer, int lane) const { return std::nullopt; }
};

struct EngineOptions {
  const char* name = "";  // the progress thread is "nanoccl-<name>"; logs say it too
  // Threads waiting on a request, and those posting one, run progress steps themselves when
  // no one else holds them (shm: a copy is cheaper than a thread hand-over).
  bool drivable = false;
  // A connection closed under a pending request fails the transport after this long, unless a
  // peer's reason (an abort frame) or another failure comes first (failSoon()).
  std::chrono::milliseconds closeGrace{0};
  // How long abort() waits for the callers' buffers to be released (twice, after unstick()).
  std::chrono::milliseconds drainBound{5000};
};

// The matcher options of a transport whose peers each send on one ordered lane, every message
// whole and in order, landing as it comes (shm's ring, fabric's numbered frames).
MatcherOptions oneOrderedLane();

class Engine {
 public:
  Engine(const TransportOptions& o, EngineOptions eo, Mover& mover);
  ~Engine();

  // ---- the transport's calls ---------------------------------------------------------------
  // Makes the Matcher (the engine fills rank, size and the delivery counter) and starts the
  // progress thread (none in a world of one).
  void start(MatcherOptions mo);
  // Requests are taken from now on; before, they fail with "used before connect()".
  void open() { open_.store(true, std::memory_order_release); }
  bool isOpen() const { return open_.load(std::memory_order_acquire); }
  // The transport is being destroyed: the mover's onStop(), then the thread ends.
  void stop(const Status& why);

  std::shared_ptr<Request> isend(int peer, const Envelope& env, const void* buf, size_t bytes);
  std::shared_ptr<Request> irecv(int peer, const Envelope& env, void* buf, size_t bytes);
  // Transport::abort(): from a completion callback (progress held) at once; otherwise the
  // progress thread fails and this waits until no operation targets a caller's buffer.
  void abort(const Status& why);
  std::vector<PeerCounters> counters() const { return counters_.snapshot(); }
  TransportCounters& peerCounters() { return counters_; }
  // Transport::stallReport(): the mover's sending side, and the lanes messages from `peer`
  // still need bytes from (Matcher::awaitedLanes), asked of whoever holds progress.
  std::string stallReport(int peer) const;
  // Runs `fn` with progress held (the progress thread's next turn); returns at once.
  void run(std::function<void()> fn);

  // Whether this thread holds progress (the progress thread, or a thread driving it).
  bool holdsProgress() const;
  // Runs progress steps on this thread until `done()` or NANOCCL_SPIN_US without anything
  // moving (drivable movers only; Request::wait calls it).
  void drive(const std::function<bool()>& done);

  // ---- with progress held (the mover) ------------------------------------------------------
  Matcher& matcher() { return *matcher_; }
  const Matcher& matcher() const { return *matcher_; }
  const Status& failed() const { return failed_; }
  bool stopping() const { return stopping_; }
  // Queued or posted requests (the Matcher's or the mover's sends).
  bool hasPending() const;
  // The one failure path: the Matcher's and the mover's requests complete with `why` (those
  // whose buffer an operation still targets once it ends), the peers are told if asked.
  void fail(const Status& why, bool notifyPeers);
  // A connection closed under a request: fail after closeGrace with `why`, unless a peer's
  // reason or another failure comes first. `parked` (a request that cannot go on, held by no
  // table) completes when the transport fails.
  void failSoon(const Status& why, const std::shared_ptr<BasicRequest>& parked = nullptr);
  // A failed transport's request whose operation has ended: complete it, unless another
  // operation still targets its buffer. Then checks whether every buffer is released.
  void completeIfFree(const std::shared_ptr<BasicRequest>& r);
  // After operations end on a failed transport: sets the flag abort() waits on once no
  // operation targets a caller's buffer.
  void updateDrained();

  // ---- what every mover reports alike (progress held) -------------------------------------
  // "rank R: ", how every message of this transport begins.
  std::string me() const { return "rank " + std::to_string(o_.rank) + ": "; }
  // A frame from `peer` failed its checks: the transport fails with `why`, naming the sender.
  void failFrom(int peer, const Status& why);
  // A checked data frame from `peer` arrived whole at `data` (on `lane`): matched with its
  // message and copied into it (shm's ring chunks, fabric's bounce buffers).
  void land(int peer, int lane, const FrameHeader& h, const char* data);
  // One of a send's frames has left; the last completes the send (and is counted).
  void frameSent(const EngineRequestPtr& req);
  // The peer failed and sent its reason (`text`): the transport fails with it, and with what
  // this rank sees stuck on its way to that peer (the mover's sendStalls(): where the peer
  // timed out waiting for bytes that left here, the link they are stuck on is told only here).
  void peerFailed(int peer, std::string_view text);
  // The peer closed `lane` in order: what arrived stays receivable; a receive that still needs
  // bytes from it fails (failSoon: the peer's reason may still come on another lane). Returns
  // whether one did.
  bool laneClosed(int peer, int lane);
  // The error of a send to a peer that closed its transport (exited, crashed, destroyed its
  // communicator).
  Status closedPeer(int peer) const;

  // ---- membership at setup, for a mover whose peers prove it in frames (fabric) -------------
  // Progress held: a frame from `peer` proved that it holds the job secret (its greeting), or
  // one claiming to come from `peer` did not.
  void proven(int peer);
  void unproven(int peer);
  // connect()'s thread (EngineTransport::started): waits until every peer has proven itself
  // (OK), the engine fails (its error), or the deadline: kTimeout naming the ranks missing and
  // those whose frames did not prove the secret, else `hint` (what to check).
  Status awaitPeers(const Deadline& deadline, const std::string& hint);

 private:
  enum class CommandKind { kSend, kRecv, kAbort, kStop, kRun };
  struct Command {
    CommandKind kind;
    EngineRequestPtr req;
    Status why;
    std::function<void()> fn;
  };

  std::shared_ptr<Request> submit(const EngineRequestPtr& req);
  void post(Command cmd);
  // A send or receive run on the posting thread (drivable movers, see EngineOptions).
  bool runOnPostingThread(const Command& cmd);
  void progressLoop();
  // One pass with progress held: the close grace, the commands, the mover's progress().
  bool step();
  bool runCommands();
  void execute(Command& cmd);
  void startSend(const EngineRequestPtr& req);
  void startRecv(const EngineRequestPtr& req);
  std::chrono::microseconds spinBudget(bool pending, Clock::time_point now) const;

  const TransportOptions o_;
  const EngineOptions eo_;
  Mover& mover_;
  const std::chrono::microseconds spin_;  // NANOCCL_SPIN_US
  std::atomic<bool> open_{false};
  std::thread thread_;
  TransportCounters counters_;
  Completion drained_;  // abort() waits for it: set once no operation targets a caller's buffer

  std::mutex mu_;  // guards commands_
  std::deque<Command> commands_;
  std::atomic<bool> commandsWaiting_{false};  // commands_ is not empty (read while spinning)

  // Held by whoever runs steps: the progress thread, or a thread driving or posting (drivable
  // movers). Everything below belongs to its holder.
  std::mutex progressMu_;
  std::atomic<std::thread::id> driver_{};  // the thread other than thread_ in a step
  Clock::time_point lastBusy_{};           // the progress thread's last step that moved
  bool stopping_ = false;
  Status failed_;
  std::optional<Matcher> matcher_;
  struct Closing {
    Status why;
    Clock::time_point until;
  };
  std::optional<Closing> closing_;  // failSoon()
  RequestList parked_;

  // The peers that proved membership at setup (awaitPeers), and the engine's failure for it.
  struct Roll {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<bool> proven;
    std::vector<uint64_t> unproven;  // frames per claimed sender that did not prove it
    Status failed;
  } roll_;
};

// A transport that runs under an Engine: the Transport calls every such transport answers alike
// go to the engine; the derived class is the Mover, and calls stopEngine() first in its
// destructor (the progress thread must end before the mover's state goes).
//
// Setup is the same steps for every mover: listen() (a world of one publishes nothing, a
// second call is refused) asks the mover to publish(); connect() checks its arguments once for
// all (after listen(), an address a rank; once it got past attach(), a second call is refused),
// has the mover attach() to its peers,
// starts the engine with the mover's matcherOptions(), lets the mover finish setup with the
// progress thread running (started()), and opens the engine to requests. A world of one only
// starts and opens the engine. All on the thread that calls them.
class EngineTransport : public Transport, protected Mover {
 public:
  Result<std::string> listen() final;
  Status connect(const std::vector<std::string>& addresses, const Deadline& deadline) final;
  std::shared_ptr<Request> isend(int peer, const Envelope& env, const void* buf,
                                 size_t bytes) override {
    return engine_.isend(peer, env, buf, bytes);
  }
  std::shared_ptr<Request> irecv(int peer, const Envelope& env, void* buf,
                                 size_t bytes) override {
    return engine_.irecv(peer, env, buf, bytes);
  }
  void abort(const Status& why) override { engine_.abort(why); }
  std::vector<PeerCounters> counters() const override { return engine_.counters(); }
  std::string stallReport(int peer) const override { return engine_.stallReport(peer); }

 protected:
  EngineTransport(const TransportOptions& o, EngineOptions eo) : o_(o), engine_(o_, eo, *this) {}
  void stopEngine() {
    engine_.stop(abortedError(engine_.me() + "communicator destroyed"));
  }

  // ---- setup, the mover's part (o_.size > 1) ------------------------------------------------
  // Opens what peers reach this rank by (sockets, a segment, an endpoint); returns its address.
  virtual Result<std::string> publish() = 0;
  // Reaches every peer from their published addresses (index = rank, one a rank).
  virtual Status attach(const std::vector<std::string>& addresses, const Deadline& deadline) = 0;
  // How the Matcher sees this mover's lanes (default: one ordered lane a peer).
  virtual MatcherOptions matcherOptions() { return oneOrderedLane(); }
  // Setup that needs the progress thread (tcp's first receives, fabric's greetings).
  virtual Status started(const Deadline& deadline) { return Status::ok(); }

  const TransportOptions o_;
  Engine engine_;

 private:
  bool listened_ = false;
  bool connected_ = false;
};

}  // namespace nanoccl
