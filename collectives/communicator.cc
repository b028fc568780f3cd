// Creating and destroying a Communicator: create, the destructor and Impl::shutdown, the
// accessors and abort. Communicator::Impl is in communicator_impl.h; its queue and worker are in
// call_queue.cc, point-to-point and the watchdog in watchdog.cc, stats in stats.cc.
#include "collectives/communicator.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/communicator_impl.h"
#include "collectives/connect.h"
#include "collectives/store.h"
#include "collectives/topology.h"
#include "collectives/tuning.h"
#include "common/crypto.h"
#include "common/logging.h"
#include "common/secret.h"
#include "common/thread_name.h"

namespace nanoccl {

using detail::P2pCall;
using detail::tlsInCallbacks;

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

}  // namespace

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

}  // namespace nanoccl
