#include "transports/routed/routed_transport.h"

#include <algorithm>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "common/thread_name.h"
#include "transports/request.h"

namespace nanoccl::routed {
namespace {

// The request handed to the caller: completed (in the parent's numbering and words) by the
// inner request's callback. Waiting on it waits on the inner one first, which may drive or
// poll its transport (common/spin.h) rather than sleep until the callback.
class RoutedRequest : public BasicRequest {
 public:
  RoutedRequest(bool isSend, int peer, const Envelope& env, char* buf, size_t bytes,
                const std::shared_ptr<Request>& inner)
      : BasicRequest(isSend, peer, env, buf, bytes), inner_(inner) {}

  Status wait(const Deadline& deadline) override {
    if (!test()) {
      // Weak: the inner request's callback holds this one until it has run.
      // Its status comes back through the callback, with this request's context added.
      if (std::shared_ptr<Request> inner = inner_.lock()) (void)inner->wait(deadline);
    }
    return BasicRequest::wait(deadline);  // the callback may still be completing this one
  }

 private:
  const std::weak_ptr<Request> inner_;
};

std::string ranksText(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ' ';  // appended piecewise: GCC 12 misreads operator+ here (-Wrestrict)
    s += std::to_string(r);
  }
  return s;
}

Status checkRoute(const TransportOptions& options, const RouteOptions& route) {
  const std::vector<int>& lr = route.localRanks;
  const bool ascending = std::adjacent_find(lr.begin(), lr.end(), [](int a, int b) {
                           return a >= b;
                         }) == lr.end();
  const bool inRange =
      !lr.empty() && lr.front() >= 0 && lr.back() < options.size && ascending;
  if (!inRange || std::find(lr.begin(), lr.end(), options.rank) == lr.end()) {
    return invalidArgument("routed transport: local ranks [" + ranksText(lr) +
                           "] are not an ascending list of ranks of a communicator of size " +
                           std::to_string(options.size) + " holding rank " +
                           std::to_string(options.rank));
  }
  if (route.remote.empty() || route.local.empty() || route.remote == route.local) {
    return invalidArgument("routed transport: needs two different transports, got '" +
                           route.remote + "' and '" + route.local + "'");
  }
  return Status::ok();
}

class Routed : public RoutedTransport {
 public:
  Routed(const TransportOptions& options, const RouteOptions& route,
         std::unique_ptr<Transport> remote, std::unique_ptr<Transport> local)
      : rank_(options.rank),
        size_(options.size),
        route_(route),
        remote_(std::move(remote)),
        local_(std::move(local)),
        localIndex_(static_cast<size_t>(options.size), -1) {
    const std::vector<int>& lr = route_.localRanks;
    identity_ = true;
    for (size_t i = 0; i < lr.size(); ++i) {
      localIndex_[lr[i]] = static_cast<int>(i);
      identity_ = identity_ && lr[i] == static_cast<int>(i);
    }
    // The local transport's errors name its own numbering; say how it maps where it differs.
    if (!identity_) {
      localContext_ = "over " + route_.local + " among this node's ranks " + ranksText(lr) +
                      " (numbered 0.." + std::to_string(lr.size() - 1) + " there): ";
    }
  }

  ~Routed() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    if (failer_.joinable()) failer_.join();
    // Both fail what is still pending; their callbacks see stopping_ and propagate nothing.
    local_.reset();
    remote_.reset();
  }

  Result<std::string> listen() override {
    NANOCCL_ASSIGN_OR_RETURN(const std::string remote, remote_->listen());
    Result<std::string> made = local_->listen();
    if (!made.isOk() && route_.fallback && made.status().code() == StatusCode::kUnavailable) {
      // Tell this node's ranks, which then all leave the local transport unused.
      NANOCCL_WARN("rank " << rank_ << ": " << made.status().toString()
                          << "; this node's collectives go over " << route_.remote);
      made = std::string(kNoLocalAddress);
    }
    NANOCCL_ASSIGN_OR_RETURN(const std::string local, std::move(made));
    if (remote.find(kAddressSeparator) != std::string::npos ||
        local.find(kAddressSeparator) != std::string::npos) {
      return internalError("routed transport: an inner address holds the separator '" +
                           std::string(1, kAddressSeparator) + "': '" + remote + "', '" + local +
                           "'");
    }
    return remote + kAddressSeparator + local;
  }

  Status connect(const std::vector<std::string>& addresses, const Deadline& deadline) override {
    if (addresses.size() != static_cast<size_t>(size_)) {
      return invalidArgument("rank " + std::to_string(rank_) + ": " +
                             std::to_string(addresses.size()) + " addresses for " +
                             std::to_string(size_) + " ranks");
    }
    std::vector<std::string> remote(addresses.size());
    std::vector<std::string> local(route_.localRanks.size());
    int noLocal = -1;  // a rank of this node whose local transport could not be set up
    for (int r = 0; r < size_; ++r) {
      const std::string& a = addresses[r];
      const size_t sep = a.find(kAddressSeparator);
      remote[r] = a.substr(0, sep);
      if (localIndex_[r] < 0) continue;
      if (sep == std::string::npos && r != rank_) {
        return mismatchError("rank " + std::to_string(rank_) + " sends collectives to rank " +
                             std::to_string(r) + " of its node over " + route_.local +
                             ", but rank " + std::to_string(r) + " uses " + route_.remote +
                             " alone (is NANOCCL_INTRA_TRANSPORT the same on every rank?)");
      }
      local[localIndex_[r]] = sep == std::string::npos ? std::string() : a.substr(sep + 1);
      if (local[localIndex_[r]] == kNoLocalAddress) noLocal = r;
    }
    if (noLocal >= 0) {
      // Every rank of the node sees the same addresses, so all of them decide alike.
      NANOCCL_INFO("rank " << rank_ << ": rank " << noLocal << " of this node has no "
                           << route_.local << " transport: this node's collectives go over "
                           << route_.remote);
      useLocal_ = false;
      local_.reset();
      return remote_->connect(remote, deadline);
    }
    // The same order on every rank: each inner setup waits only for ranks that reach it. The
    // network first: its handshake proves the job secret, so a rank with another secret is
    // named as such on both sides (the node's transport would only see a peer give up).
    NANOCCL_CHECK(remote_->connect(remote, deadline));
    return local_->connect(local, deadline).withContext(localContext_);
  }

  std::shared_ptr<Request> isend(int peer, const Envelope& env, const void* buf,
                                 size_t bytes) override {
    return post(true, peer, env, const_cast<char*>(static_cast<const char*>(buf)), bytes);
  }

  std::shared_ptr<Request> irecv(int peer, const Envelope& env, void* buf,
                                 size_t bytes) override {
    return post(false, peer, env, static_cast<char*>(buf), bytes);
  }

  void abort(const Status& why) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      failing_ = true;  // what the inner requests now fail with needs no propagating
    }
    remote_->abort(why);
    if (local_) local_->abort(why);
  }

  std::vector<PeerCounters> counters() const override {
    std::vector<PeerCounters> out(static_cast<size_t>(size_));
    for (const auto& [name, perRank] : countersPerTransport()) {
      for (size_t r = 0; r < perRank.size() && r < out.size(); ++r) out[r] += perRank[r];
    }
    return out;
  }

  std::string stallReport(int peer) const override { return remote_->stallReport(peer); }

  std::vector<RailCounters> railCounters() const override {
    std::vector<RailCounters> out = remote_->railCounters();
    if (local_) addRails(out, local_->railCounters());
    return out;
  }

  std::vector<std::pair<std::string, std::vector<PeerCounters>>> countersPerTransport()
      const override {
    std::vector<PeerCounters> remote = remote_->counters();
    remote.resize(static_cast<size_t>(size_));
    if (!local_) return {{route_.remote, std::move(remote)}};
    std::vector<PeerCounters> local(static_cast<size_t>(size_));
    const std::vector<PeerCounters> c = local_->counters();
    for (size_t i = 0; i < c.size() && i < route_.localRanks.size(); ++i) {
      local[route_.localRanks[i]] = c[i];
    }
    return {{route_.remote, std::move(remote)}, {route_.local, std::move(local)}};
  }

  // Where every rank is on this node (and numbered alike there), the local transport's board
  // reaches them all.
  Board* board() override {
    if (!useLocal_ || !local_ || !identity_ ||
        route_.localRanks.size() != static_cast<size_t>(size_)) {
      return nullptr;
    }
    return local_->board();
  }

  std::string describe() const override {
    if (!local_) return remote_->describe() + " (" + route_.local + " unavailable on this node)";
    return remote_->describe() + ", collectives within the node (ranks " +
           ranksText(route_.localRanks) + ") over " + local_->describe();
  }

 private:
  // The local rank of `peer` if a message with `env` to or from it takes the local transport,
  // else -1. Invalid peers go to the remote transport, which rejects them in this numbering.
  int localPeer(int peer, const Envelope& env) const {
    if (!useLocal_ || env.fingerprint.op == OpType::kSendRecv || peer < 0 || peer >= size_ ||
        peer == rank_) {
      return -1;
    }
    return localIndex_[peer];
  }

  std::shared_ptr<Request> post(bool isSend, int peer, const Envelope& env, char* buf,
                                size_t bytes) {
    const int lr = localPeer(peer, env);
    Transport& t = lr >= 0 ? *local_ : *remote_;
    const int innerPeer = lr >= 0 ? lr : peer;
    std::shared_ptr<Request> inner =
        isSend ? t.isend(innerPeer, env, buf, bytes) : t.irecv(innerPeer, env, buf, bytes);
    // The caller's request: its own callback slot, parent ranks, and a look at every outcome.
    auto outer = std::make_shared<RoutedRequest>(isSend, peer, env, buf, bytes, inner);
    inner->setCallback([this, outer, viaLocal = lr >= 0](const Status& st, int source) {
      finish(*outer, st, source, viaLocal);
    });
    return outer;
  }

  // On an inner progress thread (or the posting thread, for a request that failed at once).
  void finish(BasicRequest& outer, const Status& st, int source, bool viaLocal) {
    if (!viaLocal) {
      if (!st.isOk()) innerFailed(st);
      return outer.complete(st, source);
    }
    const Status s = st.withContext(localContext_);
    if (!s.isOk()) innerFailed(s);
    const int parent = source >= 0 && source < static_cast<int>(route_.localRanks.size())
                           ? route_.localRanks[source]
                           : -1;
    outer.complete(s, parent);
  }

  // An inner request failed: unless the caller erred (kInvalidArgument), its transport did,
  // and the other one must follow. Not here: abort() waits for the other's progress thread,
  // which may itself be in a callback waiting for ours.
  void innerFailed(const Status& why) {
    if (why.code() == StatusCode::kInvalidArgument) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (failing_ || stopping_) return;
    failing_ = true;
    NANOCCL_INFO("rank " << rank_ << ": routed transport fails both inner transports: "
                          << why.toString());
    failer_ = namedThread("abort", [this, why] {
      remote_->abort(why);
      if (local_) local_->abort(why);
    });
  }

  const int rank_;
  const int size_;
  const RouteOptions route_;
  std::unique_ptr<Transport> remote_;
  std::unique_ptr<Transport> local_;
  std::vector<int> localIndex_;  // per rank: its local rank, or -1 on another node
  bool identity_ = true;         // local rank i is rank i: no renumbering to explain
  bool useLocal_ = true;         // false once connect() found the local transport unavailable
  std::string localContext_;     // prefixed to the local transport's errors

  std::mutex mu_;  // guards failing_, stopping_, failer_
  bool failing_ = false;
  bool stopping_ = false;
  std::thread failer_;
};

}  // namespace

Result<std::vector<std::string>> plainAddresses(const std::vector<std::string>& addresses, int rank,
                                                const std::vector<int>& localRanks) {
  std::vector<std::string> out(addresses.size());
  for (size_t r = 0; r < addresses.size(); ++r) {
    const size_t sep = addresses[r].find(kAddressSeparator);
    const bool local = std::find(localRanks.begin(), localRanks.end(), static_cast<int>(r)) !=
                       localRanks.end();
    if (sep != std::string::npos && local && static_cast<int>(r) != rank) {
      return mismatchError("rank " + std::to_string(rank) + " uses one transport for everything, "
                           "but rank " + std::to_string(r) + " of its node sends its collectives "
                           "through shared memory (is NANOCCL_INTRA_TRANSPORT the same on every "
                           "rank?)");
    }
    out[r] = addresses[r].substr(0, sep);
  }
  return out;
}

TransportOptions localTransportOptions(const TransportOptions& options, const RouteOptions& route) {
  TransportOptions o = options;
  const auto it = std::find(route.localRanks.begin(), route.localRanks.end(), options.rank);
  o.rank = static_cast<int>(it - route.localRanks.begin());
  o.size = static_cast<int>(route.localRanks.size());
  // Its own id: its handshakes and segments never meet the parent's or the hierarchy's.
  o.commId = options.commId + "/routed-" + route.local;
  return o;
}

Result<std::unique_ptr<RoutedTransport>> createRoutedTransport(const TransportOptions& options,
                                                               const RouteOptions& route) {
  NANOCCL_CHECK(checkRoute(options, route));
  NANOCCL_ASSIGN_OR_RETURN(std::unique_ptr<Transport> remote,
                           createTransport(route.remote, options));
  NANOCCL_ASSIGN_OR_RETURN(std::unique_ptr<Transport> local,
                           createTransport(route.local, localTransportOptions(options, route)));
  return createRoutedTransport(options, route, std::move(remote), std::move(local));
}

Result<std::unique_ptr<RoutedTransport>> createRoutedTransport(const TransportOptions& options,
                                                               const RouteOptions& route,
                                                               std::unique_ptr<Transport> remote,
                                                               std::unique_ptr<Transport> local) {
  NANOCCL_CHECK(checkRoute(options, route));
  if (!remote || !local) return invalidArgument("routed transport: an inner transport is null");
  return std::unique_ptr<RoutedTransport>(
      std::make_unique<Routed>(options, route, std::move(remote), std::move(local)));
}

}  // namespace nanoccl::routed
