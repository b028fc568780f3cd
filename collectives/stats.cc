// A Communicator's counters (Communicator::stats) and how the stats of several add up
// (CommStats::operator+=).
#include "collectives/communicator.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/communicator_impl.h"
#include "transports/routed/routed_transport.h"

namespace nanoccl {

using detail::AlgorithmRow;
using detail::kNumOpTypes;

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
