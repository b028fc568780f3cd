#include "collectives/tuning.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>

#include "collectives/algorithm.h"
#include "collectives/codec/codec.h"
#include "common/logging.h"
#include "common/reduce.h"

namespace nanoccl {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Four significant digits, never in exponent form (rates reach 10^5 MB/s).
std::string number(double x) {
  char buf[48];
  if (x >= 1000) {
    std::snprintf(buf, sizeof buf, "%.0f", x);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g", x);
  }
  return buf;
}

// ---- the text format ------------------------------------------------------------------------

std::string classLine(const char* name, const LinkClassProfile& c) {
  if (!c.present) return std::string(name) + " none\n";
  return std::string(name) + " alpha_us " + number(c.alphaUs) + " pair_MBps " +
         number(c.pairMBps) + " node_MBps " + number(c.nodeMBps) + "\n";
}

// A token from a file for an error message: at most 40 characters, non-printable ones as '?'.
std::string printable(const std::string& s) {
  std::string out = s.substr(0, 40);
  for (char& ch : out) {
    if (ch < 0x20 || ch > 0x7e) ch = '?';
  }
  return out;
}

// Reads "key value key value ..." pairs after the record name; every key of `want` exactly
// once, nothing else, each value a finite number > 0.
Status readRates(const std::vector<std::string>& tok, size_t from,
                 const std::vector<std::pair<const char*, double*>>& want, const std::string& at) {
  if ((tok.size() - from) != 2 * want.size()) {
    std::string keys;
    for (const auto& [k, v] : want) keys += std::string(keys.empty() ? "" : ", ") + k;
    return invalidArgument(at + "'" + tok[0] + "' takes " + keys + ", each with a value");
  }
  std::vector<bool> seen(want.size(), false);
  for (size_t i = from; i < tok.size(); i += 2) {
    size_t k = 0;
    while (k < want.size() && tok[i] != want[k].first) ++k;
    if (k == want.size() || seen[k]) {
      return invalidArgument(at + "unexpected or repeated key '" + printable(tok[i]) + "' in '" +
                             tok[0] + "'");
    }
    seen[k] = true;
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(tok[i + 1].c_str(), &end);
    if (errno != 0 || *end != '\0' || !std::isfinite(x) || x <= 0) {
      return invalidArgument(at + tok[i] + " " + printable(tok[i + 1]) +
                             ": expected a number > 0");
    }
    *want[k].second = x;
  }
  return Status::ok();
}

std::vector<std::string> tokens(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line.substr(0, line.find('#')));
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

std::string utcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ---- CPU rates ------------------------------------------------------------------------------

// MB/s of `bytes` for the faster of two runs of f() (the first also touches fresh pages).
template <typename F>
double rate(size_t bytes, F&& f) {
  double best = 1e30;
  for (int i = 0; i < 2; ++i) {
    const Clock::time_point t0 = Clock::now();
    f();
    best = std::min(best, secondsSince(t0));
  }
  return static_cast<double>(bytes) / std::max(best, 1e-9) / 1e6;
}

// ---- link probes ----------------------------------------------------------------------------
//
// Every probe runs as call #0 of the transports it uses (real calls start at #1), with tags
// unique per transport, so its messages can never meet a real call's.

constexpr int kPings = 16;
constexpr uint32_t kPingTag = 0;       // [0, kPings)
constexpr uint32_t kPairBulkTag = 100;  // [100, 100 + kBulks)
constexpr uint32_t kNodeBulkTag = 200;  // [200, 205)
constexpr uint32_t kBarrierTag = 1000;  // + 32 x barrier + round
constexpr int kBulks = 2;
constexpr size_t kInterBulkBytes = size_t{4} << 20;
constexpr size_t kIntraBulkBytes = size_t{16} << 20;
constexpr size_t kMaxNodeBulkBytes = size_t{32} << 20;
constexpr off_t kMaxProfileBytes = 64 << 10;
constexpr double kNodeProbeSeconds = 0.03;

struct Probe {
  double alphaUs = 0;   // half the median round trip of 8 bytes (0 when not pinged)
  double seconds = 0;   // the last bulk transfer, less one round trip
};

// Ranks `a` (who times) and `b` of `ctx`: `pings` round trips, then `bulks` transfers of
// `bytes` from a to b, each answered by an empty message. Other ranks do nothing.
Result<Probe> probePair(detail::Context& ctx, int a, int b, int pings, size_t bytes,
                        uint32_t bulkTag, int bulks = kBulks) {
  const int me = ctx.rank();
  if (me != a && me != b) return Probe{};
  const int peer = me == a ? b : a;
  char* buf = ctx.scratch(std::max<size_t>(bytes, 8));
  std::fill(buf, buf + std::max<size_t>(bytes, 8), 0);
  std::vector<double> rtts;
  for (int i = 0; i < pings; ++i) {
    const uint32_t tag = kPingTag + static_cast<uint32_t>(i);
    const Clock::time_point t0 = Clock::now();
    if (me == a) {
      detail::Pending rx = ctx.irecv(peer, tag, buf, 8);
      NANOCCL_CHECK(ctx.wait(ctx.isend(peer, tag, buf, 8)));
      NANOCCL_CHECK(ctx.wait(rx));
      rtts.push_back(secondsSince(t0));
    } else {
      NANOCCL_CHECK(ctx.wait(ctx.irecv(peer, tag, buf, 8)));
      NANOCCL_CHECK(ctx.wait(ctx.isend(peer, tag, buf, 8)));
    }
  }
  Probe out;
  double rtt = 0;
  if (!rtts.empty()) {
    std::sort(rtts.begin(), rtts.end());
    rtt = rtts[rtts.size() / 2];
    out.alphaUs = rtt / 2 * 1e6;
  }
  for (int k = 0; k < bulks; ++k) {
    const uint32_t tag = bulkTag + static_cast<uint32_t>(k);
    if (me == a) {
      const Clock::time_point t0 = Clock::now();
      detail::Pending ack = ctx.irecv(peer, tag, detail::ackSink(), 0);
      NANOCCL_CHECK(ctx.wait(ctx.isend(peer, tag, buf, bytes)));
      NANOCCL_CHECK(ctx.wait(ack));
      const double t = secondsSince(t0);
      // The last transfer counts: the first one pays TCP's slow start, and a token-bucket
      // shaper's burst (an idle link's credit) would make the first look faster than the
      // link is.
      out.seconds = std::max(t - rtt, t / 2);
    } else {
      NANOCCL_CHECK(ctx.wait(ctx.irecv(peer, tag, buf, bytes)));
      NANOCCL_CHECK(ctx.wait(ctx.isend(peer, tag, detail::kAckByte, 0)));
    }
  }
  return out;
}

// Every rank of `ctx` (dissemination); `which` numbers the barriers of the probe.
Status barrier(detail::Context& ctx, uint32_t which) {
  const int n = ctx.size();
  const int r = ctx.rank();
  char* in = ctx.scratch(32);
  static const char kToken = 1;
  uint32_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, ++round) {
    const uint32_t tag = kBarrierTag + 32 * which + round;
    detail::Pending rx = ctx.irecv((r - dist + n) % n, tag, in + round, 1);
    NANOCCL_CHECK(ctx.wait(ctx.isend((r + dist) % n, tag, &kToken, 1)));
    NANOCCL_CHECK(ctx.wait(rx));
  }
  return Status::ok();
}

Status publish(Store& store, const std::string& key, double value) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  return store.set("tune/" + key, buf);
}

Result<double> fetch(Store& store, const std::string& key, const Deadline& deadline) {
  NANOCCL_ASSIGN_OR_RETURN(std::string v, store.get("tune/" + key, deadline));
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (*end != '\0' || !std::isfinite(x)) return protocolError("tune/" + key + ": not a number");
  return x;
}

// What the timing rank of a pair probe tells rank 0, under "<cls>/" ("inter", "intra").
Status publishPair(Store& store, const std::string& cls, const Probe& p) {
  NANOCCL_CHECK(publish(store, cls + "/alpha_us", p.alphaUs));
  return publish(store, cls + "/pair_s", p.seconds);
}

// Rank 0: a link class from what its pair probe published (`bulkBytes` a transfer).
Result<LinkClassProfile> collectPair(Store& store, const std::string& cls, size_t bulkBytes,
                                     const Deadline& deadline) {
  LinkClassProfile c;
  c.present = true;
  NANOCCL_ASSIGN_OR_RETURN(c.alphaUs, fetch(store, cls + "/alpha_us", deadline));
  NANOCCL_ASSIGN_OR_RETURN(const double pair, fetch(store, cls + "/pair_s", deadline));
  c.pairMBps = static_cast<double>(bulkBytes) / pair / 1e6;
  c.nodeMBps = c.pairMBps;
  return c;
}

// The probes' transports, one Context each (call #0; real calls start at #1).
struct ProbeContexts {
  std::unique_ptr<detail::Context> main;
  std::unique_ptr<detail::Context> cross;  // this rank's shard across nodes, where it has one
  std::unique_ptr<detail::Context> local;  // this rank's node, where it has a local group
  std::unique_ptr<detail::Context> oneSocket;  // the inter-node one, one connection a peer

  // After a failed probe: ends what is still in flight before the scratch memory goes, and
  // keeps (leaks) the memory a stuck transfer may still target.
  void abandon(const TuningTarget& t, const Status& why) {
    if (t.main != nullptr) t.main->abort(why);
    if (const detail::Hierarchy* h = t.hierarchy) {
      if (h->cross.transport) h->cross.transport->abort(why);
      if (h->local.transport) h->local.transport->abort(why);
    }
    for (auto* ctx : {main.get(), cross.get(), local.get(), oneSocket.get()}) {
      if (ctx == nullptr) continue;
      detail::Context::Leftover left = ctx->takeUnfinished();
      if (left.requests.empty()) {
        continue;
      }
      for (detail::ScratchPool::Block& b : left.scratch) (void)b.mem.release();
    }
  }
};

// The probes, on every rank; rank 0 returns the link classes (others: empty classes).
Result<LinkProfile> probeLinks(Store& store, const TuningTarget& t, ProbeContexts& ctxs,
                               const Deadline& deadline) {
  const Topology& topo = *t.topology;
  const detail::Hierarchy* h = t.hierarchy;
  detail::Context& main = *ctxs.main;
  uint32_t barriers = 0;
  const auto sync = [&] { return barrier(main, barriers++); };

  LinkProfile out;
  if (topo.numNodes() >= 2) {
    // Inter-node: node 0 and node 1. On a hierarchical topology local rank s of each node
    // talks over its cross group (node index = cross rank); first shard 0 alone (latency and
    // one pair), then every shard at once (what a node's link carries in a hierarchical call).
    // On a flat one (one rank a node), global ranks 0 and 1.
    const int shard = h != nullptr ? topo.localRankOf[t.rank] : 0;
    const int shards = h != nullptr ? h->shards : 1;
    detail::Context* inter = h != nullptr ? ctxs.cross.get() : &main;
    NANOCCL_CHECK(sync());
    if (inter != nullptr && shard == 0) {
      NANOCCL_ASSIGN_OR_RETURN(Probe p,
                               probePair(*inter, 0, 1, kPings, kInterBulkBytes, kPairBulkTag));
      if (inter->rank() == 0) NANOCCL_CHECK(publishPair(store, "inter", p));
    }
    // Every shard at once, timed by rank 0 from one barrier to the next (less what an empty
    // pair of barriers takes): each shard's own timer would also count the time it ran alone.
    // A first, untimed transfer warms every shard's connections.
    // Each shard sends what one pair moves in ~30 ms (rank 0 says how much): on fast links a
    // fixed 4 MB took a few ms, no more than the barriers around it on a busy machine.
    // Then the same over one connection a peer (tcp with several): the planner's socket count.
    const bool sockets = t.transport == "tcp" && t.config->nsocks > 1;
    double nodeSeconds = 0;
    double oneSocketSeconds = 0;
    size_t nodeBytes = kInterBulkBytes;
    if (shards > 1 || sockets) {
      if (t.rank == 0) {
        NANOCCL_ASSIGN_OR_RETURN(const double pair, fetch(store, "inter/pair_s", deadline));
        const double want = static_cast<double>(kInterBulkBytes) / pair * kNodeProbeSeconds;
        nodeBytes = std::clamp<size_t>(static_cast<size_t>(want) >> 20 << 20, kInterBulkBytes,
                                       kMaxNodeBulkBytes);
        NANOCCL_CHECK(publish(store, "inter/node_bytes", static_cast<double>(nodeBytes)));
      } else {
        NANOCCL_ASSIGN_OR_RETURN(const double b, fetch(store, "inter/node_bytes", deadline));
        nodeBytes = static_cast<size_t>(b);
      }
      NANOCCL_CHECK(sync());
      if (inter != nullptr) {
        NANOCCL_CHECK(probePair(*inter, 0, 1, 0, nodeBytes, kNodeBulkTag, 1).status());
      }
      // Every shard at once on `ctx`, timed by rank 0 from one barrier to the next.
      const auto allShards = [&](detail::Context* ctx, uint32_t tag) -> Result<double> {
        NANOCCL_CHECK(sync());
        Clock::time_point t0 = Clock::now();
        NANOCCL_CHECK(sync());
        const double empty = secondsSince(t0);
        t0 = Clock::now();
        if (ctx != nullptr) NANOCCL_CHECK(probePair(*ctx, 0, 1, 0, nodeBytes, tag, 1).status());
        NANOCCL_CHECK(sync());
        return std::max(secondsSince(t0) - empty, 1e-6);
      };
      NANOCCL_ASSIGN_OR_RETURN(nodeSeconds, allShards(inter, kNodeBulkTag + 1));
      if (sockets) {
        // Twice each, all connections then one, one, all, and the faster of each: one such
        // transfer varied by ~15% on the busy 2-core machine (results/tuning), more than the
        // gain the socket count is decided by (planner.h), and picked two connections a peer
        // for int8 calls at 1 Gbit/s that ran 5-10% slower than one. The order keeps a steady
        // drift of the machine off either side.
        if (inter != nullptr) ctxs.oneSocket = inter->withLanes(1);
        detail::Context* one = ctxs.oneSocket.get();
        NANOCCL_ASSIGN_OR_RETURN(oneSocketSeconds, allShards(one, kNodeBulkTag + 2));
        NANOCCL_ASSIGN_OR_RETURN(const double oneAgain, allShards(one, kNodeBulkTag + 3));
        NANOCCL_ASSIGN_OR_RETURN(const double allAgain, allShards(inter, kNodeBulkTag + 4));
        oneSocketSeconds = std::min(oneSocketSeconds, oneAgain);
        nodeSeconds = std::min(nodeSeconds, allAgain);
      }
    }
    NANOCCL_CHECK(sync());
    if (t.rank == 0) {
      NANOCCL_ASSIGN_OR_RETURN(out.inter, collectPair(store, "inter", kInterBulkBytes, deadline));
      const double moved = static_cast<double>(nodeBytes) * shards / 1e6;
      if (shards > 1 || sockets) out.inter.nodeMBps = moved / nodeSeconds;
      if (sockets) out.inter.oneSocketMBps = moved / oneSocketSeconds;
    }
  }
  // Intra-node: local ranks 0 and 1 of the first node with two ranks, over the transport the
  // collectives of a node use (the hierarchy's local group; the main one on a single node).
  int firstPair = -1;
  for (int n = 0; n < topo.numNodes() && firstPair < 0; ++n) {
    if (topo.localSize(n) >= 2) firstPair = n;
  }
  if (firstPair >= 0) {
    NANOCCL_CHECK(sync());
    if (topo.nodeOf[t.rank] == firstPair) {
      detail::Context* intra = h != nullptr ? ctxs.local.get() : &main;
      const int a = h != nullptr ? 0 : topo.nodeRanks[firstPair][0];
      const int b = h != nullptr ? 1 : topo.nodeRanks[firstPair][1];
      NANOCCL_ASSIGN_OR_RETURN(Probe p,
                               probePair(*intra, a, b, kPings, kIntraBulkBytes, kPairBulkTag + 50));
      if (intra->rank() == a) NANOCCL_CHECK(publishPair(store, "intra", p));
    }
    NANOCCL_CHECK(sync());
    if (t.rank == 0) {
      NANOCCL_ASSIGN_OR_RETURN(out.intra, collectPair(store, "intra", kIntraBulkBytes, deadline));
    }
  }
  return out;
}

Result<LinkProfile> probeLinks(Store& store, const TuningTarget& t, const Deadline& deadline) {
  OpFingerprint fp;
  fp.op = OpType::kBarrier;
  fp.seq = 0;
  const Config& config = *t.config;
  ProbeContexts ctxs;
  ctxs.main = std::make_unique<detail::Context>(t.main, t.rank, t.size, fp, deadline, t.timeout,
                                                config);
  if (const detail::Hierarchy* h = t.hierarchy) {
    if (h->cross.transport) {
      ctxs.cross = std::make_unique<detail::Context>(h->cross.transport.get(), h->cross.rank,
                                                     h->cross.size, fp, deadline, t.timeout,
                                                     config);
    }
    if (h->local.transport) {
      ctxs.local = std::make_unique<detail::Context>(h->local.transport.get(), h->local.rank,
                                                     h->local.size, fp, deadline, t.timeout,
                                                     config);
    }
  }
  Result<LinkProfile> out = probeLinks(store, t, ctxs, deadline);
  if (!out.isOk()) ctxs.abandon(t, out.status());
  return out;
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// Cores this process may run on over the ranks that published rank 0's host name, at most 1.
Result<double> cpuShareOfRankZero(Store& store, int size, const Deadline& deadline) {
  const std::string mine = hostName();
  int ranks = 0;
  for (int r = 0; r < size; ++r) {
    NANOCCL_ASSIGN_OR_RETURN(std::string host, store.get("tune/host/" + std::to_string(r), deadline));
    ranks += host == mine ? 1 : 0;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::min(1.0, static_cast<double>(cores) / std::max(ranks, 1));
}

// Rank 0's decision, handed to the others under "tune/plan".
constexpr const char* kPlanOff = "off";
constexpr const char* kPlanUse = "use";
constexpr const char* kPlanMeasure = "measure";
constexpr const char* kPlanError = "error: ";

}  // namespace

std::string LinkProfile::toText() const {
  std::string s =
      "# nanoccl link profile (README \"Tuning\"): latencies in us, rates in MB/s (10^6 B/s)\n";
  s += "version " + std::to_string(kVersion) + "\n";
  s += "shape " + shape + "\n";
  s += "transport " + transport + "\n";
  s += "nsocks " + std::to_string(nsocks) + "\n";
  s += "measured " + measured + "\n";
  s += classLine("inter", inter);
  if (inter.present && inter.oneSocketMBps > 0) {
    s += "inter_one_socket_MBps " + number(inter.oneSocketMBps) + "\n";
  }
  s += classLine("intra", intra);
  s += "reduce_MBps " + number(reduceMBps) + "\n";
  s += "cpu_share " + number(cpuShare) + "\n";
  for (const CodecRates& c : codecs) {
    s += "codec " + c.name + " encode_MBps " + number(c.encodeMBps) + " decode_MBps " +
         number(c.decodeMBps) + " accumulate_MBps " + number(c.accumulateMBps) + "\n";
  }
  return s;
}

Result<LinkProfile> LinkProfile::parse(const std::string& text, const std::string& where) {
  LinkProfile p;
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  std::vector<std::string> seen;
  const auto once = [&](const std::string& key, const std::string& at) -> Status {
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return invalidArgument(at + "'" + key + "' given twice");
    }
    seen.push_back(key);
    return Status::ok();
  };
  while (std::getline(in, line)) {
    ++lineNo;
    const std::string at = where + ":" + std::to_string(lineNo) + ": ";
    const std::vector<std::string> tok = tokens(line);
    if (tok.empty()) continue;
    const std::string& key = tok[0];
    if (key == "codec") {
      if (tok.size() < 2) return invalidArgument(at + "'codec' needs a codec name");
      Result<const codec::Codec*> c = codec::findCodec(tok[1]);
      if (!c.isOk() || c.value()->id == codec::CodecId::kNone) {
        return invalidArgument(at + "unknown codec '" + printable(tok[1]) + "'");
      }
      const std::string name = c.value()->name;  // "INT8" is int8, once
      NANOCCL_CHECK(once("codec " + name, at));
      CodecRates r;
      r.name = name;
      NANOCCL_CHECK(readRates(tok, 2,
                              {{"encode_MBps", &r.encodeMBps},
                               {"decode_MBps", &r.decodeMBps},
                               {"accumulate_MBps", &r.accumulateMBps}},
                              at));
      p.codecs.push_back(r);
      continue;
    }
    NANOCCL_CHECK(once(key, at));
    if (key == "inter" || key == "intra") {
      LinkClassProfile& c = key == "inter" ? p.inter : p.intra;
      if (tok.size() == 2 && tok[1] == "none") continue;
      c.present = true;
      NANOCCL_CHECK(readRates(tok, 1,
                              {{"alpha_us", &c.alphaUs},
                               {"pair_MBps", &c.pairMBps},
                               {"node_MBps", &c.nodeMBps}},
                              at));
      continue;
    }
    if (key == "inter_one_socket_MBps") {
      NANOCCL_CHECK(readRates(tok, 0, {{"inter_one_socket_MBps", &p.inter.oneSocketMBps}}, at));
      continue;
    }
    if (key == "reduce_MBps") {
      NANOCCL_CHECK(readRates(tok, 0, {{"reduce_MBps", &p.reduceMBps}}, at));
      continue;
    }
    if (key == "cpu_share") {
      NANOCCL_CHECK(readRates(tok, 0, {{"cpu_share", &p.cpuShare}}, at));
      if (p.cpuShare > 1) return invalidArgument(at + "cpu_share " + tok[1] + ": at most 1");
      continue;
    }
    static const char* const kSingle[] = {"version", "shape", "transport", "nsocks", "measured"};
    if (std::find_if(std::begin(kSingle), std::end(kSingle),
                     [&](const char* k) { return key == k; }) == std::end(kSingle)) {
      return invalidArgument(at + "unknown record '" + printable(key) + "'");
    }
    if (tok.size() != 2) return invalidArgument(at + "'" + key + "' takes one value");
    const std::string& v = tok[1];
    if (key == "version") {
      if (v != std::to_string(kVersion)) {
        return invalidArgument(at + "version " + printable(v) + ": this nanoccl reads version " +
                               std::to_string(kVersion) + " (run nanoccl-tune again)");
      }
    } else if (key == "shape") {
      p.shape = v;
    } else if (key == "transport") {
      p.transport = v;
    } else if (key == "nsocks") {
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (*end != '\0' || n < 1 || n > 64) {
        return invalidArgument(at + "nsocks " + printable(v) + ": expected an integer in [1, 64]");
      }
      p.nsocks = static_cast<int>(n);
    } else {
      p.measured = v;
    }
  }
  for (const char* required : {"version", "shape", "transport", "nsocks", "measured", "inter",
                               "intra", "reduce_MBps", "cpu_share"}) {
    if (std::find(seen.begin(), seen.end(), required) == seen.end()) {
      return invalidArgument(where + ": no '" + required + "' record (not a link profile?)");
    }
  }
  if (p.inter.oneSocketMBps > 0 && !p.inter.present) {
    return invalidArgument(where + ": 'inter_one_socket_MBps' with 'inter none'");
  }
  return p;
}

bool LinkProfile::fits(const std::string& s, const std::string& t, int n) const {
  return shape == s && transport == t && nsocks == n;
}

std::string LinkProfile::summary() const {
  std::string s = shape + " over " + transport + " x" + std::to_string(nsocks) + ":";
  const auto cls = [&](const char* name, const LinkClassProfile& c) {
    if (!c.present) return;
    s += std::string(" ") + name + " " + number(c.alphaUs) + " us, " + number(c.pairMBps) +
         " MB/s a pair, " + number(c.nodeMBps) + " MB/s a node;";
  };
  cls("inter", inter);
  cls("intra", intra);
  s += " reduce " + number(reduceMBps) + " MB/s, " + number(cpuShare) + " core a rank";
  for (const CodecRates& c : codecs) {
    s += "; " + c.name + " " + number(c.encodeMBps) + "/" + number(c.decodeMBps) + " MB/s";
  }
  return s;
}

std::string shapeOf(const Topology& topology) {
  const int n = topology.numNodes();
  if (topology.minLocalSize() == topology.maxLocalSize()) {
    return std::to_string(n) + "x" + std::to_string(topology.minLocalSize());
  }
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += '+';
    s += std::to_string(topology.localSize(i));
  }
  return s;
}

std::string profilePath(const Config& config) {
  if (!config.tuningFile.empty()) return config.tuningFile;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') {
    return std::string(xdg) + "/nanoccl/link_profile.txt";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : "/tmp") +
         "/.cache/nanoccl/link_profile.txt";
}

Result<std::optional<LinkProfile>> loadProfile(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<LinkProfile>();
    return systemError(("reading the link profile " + path).c_str(), errno);
  }
  // Not a FIFO or a device that would block or never end: a small regular file.
  if (!S_ISREG(st.st_mode) || st.st_size > kMaxProfileBytes) {
    return invalidArgument(path + ": not a link profile (" +
                           (S_ISREG(st.st_mode) ? "larger than 64 KiB" : "not a regular file") +
                           ")");
  }
  std::ifstream f(path);
  if (!f) return systemError(("reading the link profile " + path).c_str(), errno);
  std::ostringstream text;
  text << f.rdbuf();
  NANOCCL_ASSIGN_OR_RETURN(LinkProfile p, LinkProfile::parse(text.str(), path));
  return std::optional<LinkProfile>(std::move(p));
}

Status saveProfile(const LinkProfile& profile, const std::string& path) {
  // The directories, as `mkdir -p` (0700: ~/.cache/nanoccl is the user's own).
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    const std::string dir = path.substr(0, slash);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return systemError(("creating " + dir).c_str(), errno);
    }
  }
  // A fresh file of our own (never a link someone left), complete on disk, then renamed over
  // the old one: readers see the old profile or the new one, never half of one.
  std::string tmp = path + ".XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return systemError(("creating a file beside " + path).c_str(), errno);
  const std::string text = profile.toText();
  size_t done = 0;
  int err = 0;
  while (done < text.size() && err == 0) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      err = errno;
    }
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return systemError(("writing " + path).c_str(), err);
  }
  return Status::ok();
}

void measureCpuRates(LinkProfile& profile) {
  // 16 MB of float32 a buffer: larger than the caches of most machines' cores, as the tensors
  // that go through a codec are (rates from cache-hot buffers were 2-3x too high here).
  constexpr size_t kCount = size_t{1} << 22;
  constexpr size_t kBytes = kCount * sizeof(float);
  std::vector<float> a(kCount), b(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    a[i] = std::sin(static_cast<float>(i) * 0.01f) * 3.0f;
    b[i] = static_cast<float>(i % 97) * 0.125f;
  }
  profile.reduceMBps = rate(kBytes, [&] {
    (void)reduceInto(b.data(), a.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
  });
  profile.codecs.clear();
  const codec::Codec* table = codec::codecTable();
  for (int i = 0; i < static_cast<int>(codec::CodecId::kNumCodecs); ++i) {
    const codec::Codec& c = table[i];
    if (c.id == codec::CodecId::kNone) continue;
    codec::CodecParams params;
    const size_t bytes = c.encodedBytes(kCount, params);
    std::vector<char> enc(bytes);
    CodecRates r;
    r.name = c.name;
    r.encodeMBps = rate(kBytes, [&] {
      (void)c.encode(a.data(), DataType::kFloat32, kCount, params, enc.data(), bytes);
    });
    r.decodeMBps = rate(kBytes, [&] { (void)c.decode(enc.data(), bytes, b.data(), kCount); });
    r.accumulateMBps =
        rate(kBytes, [&] { (void)c.decodeAccumulate(enc.data(), bytes, b.data(), kCount); });
    profile.codecs.push_back(r);
  }
}

namespace {

// What every rank's planner must agree on when a profile is in force: the mode, and the
// settings that change what the planner picks with it.
std::string planningSettings(const Config& c) {
  return "NANOCCL_TUNING=" + c.tuning + " NANOCCL_COMPRESSION=" + c.compression +
         " NANOCCL_COMPRESSION_ALLOW=" + c.compressionAllow +
         " NANOCCL_COMPRESSION_BLOCK=" + std::to_string(c.compressionBlock) +
         " NANOCCL_CHUNK_BYTES=" + (c.chunkBytesSet ? std::to_string(c.chunkBytes) : "(planned)") +
         " NANOCCL_NSOCKS=" + (c.nsocksSet ? std::to_string(c.nsocks) : "(planned)");
}

// Rank 0, when measuring: the profile's text, from what every rank probed.
Result<std::string> measuredProfile(Store& store, const TuningTarget& t, LinkProfile p,
                                    const std::string& path, const Deadline& deadline) {
  const Config& config = *t.config;
  p.shape = shapeOf(*t.topology);
  p.transport = t.transport;
  p.nsocks = config.nsocks;
  p.measured = utcNow();
  measureCpuRates(p);
  NANOCCL_ASSIGN_OR_RETURN(p.cpuShare, cpuShareOfRankZero(store, t.size, deadline));
  const Status saved = saveProfile(p, path);
  if (!saved.isOk()) {
    NANOCCL_WARN("rank 0: tuning: could not save the link profile: " << saved.message());
  } else {
    NANOCCL_INFO("rank 0: tuning: saved to " << path);
  }
  return p.toText();
}

}  // namespace

Result<std::shared_ptr<const LinkProfile>> agreeOnProfile(Store& store, const TuningTarget& t,
                                                          const Deadline& deadline) {
  const Config& config = *t.config;
  const std::string who = "rank " + std::to_string(t.rank) + ": tuning: ";
  // Without a profile the planner's rules take the call alone (and a codec that differs is
  // a mismatch at the call, as ever); with one, these settings steer it too.
  const std::string mine = config.tuning == "off" ? "NANOCCL_TUNING=off" : planningSettings(config);
  NANOCCL_CHECK(store.set("tune/mode/" + std::to_string(t.rank), mine));
  const std::string shape = shapeOf(*t.topology);
  const std::string path = profilePath(config);
  std::string plan;
  std::string text;
  if (t.rank == 0) {
    for (int r = 1; r < t.size && plan.empty(); ++r) {
      NANOCCL_ASSIGN_OR_RETURN(std::string theirs,
                               store.get("tune/mode/" + std::to_string(r), deadline));
      if (theirs != mine) {
        plan = kPlanError + std::string("rank ") + std::to_string(r) + " has " + theirs +
               ", rank 0 has " + mine + " (NANOCCL_COMPRESSION=auto turns tuning off into "
               "cached): set the same on every rank";
      }
    }
    if (!plan.empty()) {
    } else if (config.tuning == "off") {
      plan = kPlanOff;
    } else if (config.tuning == "cached") {
      Result<std::optional<LinkProfile>> cached = loadProfile(path);
      if (!cached.isOk()) {
        plan = kPlanError + cached.status().message() + " (fix or delete it, or set "
               "NANOCCL_TUNING=measure to measure again)";
      } else if (cached.value() && cached.value()->fits(shape, t.transport, config.nsocks)) {
        plan = kPlanUse;
        text = cached.value()->toText();
      } else {
        if (cached.value()) {
          NANOCCL_INFO(who << "the profile in " << path << " is for " << cached.value()->shape
                           << " over " << cached.value()->transport << " x"
                           << cached.value()->nsocks << "; measuring " << shape << " over "
                           << t.transport << " x" << config.nsocks);
        }
        plan = kPlanMeasure;
      }
    } else {
      plan = kPlanMeasure;
    }
    NANOCCL_CHECK(store.set("tune/plan", plan));
  } else {
    NANOCCL_ASSIGN_OR_RETURN(plan, store.get("tune/plan", deadline));
  }
  if (plan.rfind(kPlanError, 0) == 0) {
    return invalidArgument(who + plan.substr(std::string(kPlanError).size()) +
                           (t.rank == 0 ? "" : " (found by rank 0)"));
  }
  if (plan == kPlanOff) return std::shared_ptr<const LinkProfile>();
  if (plan == kPlanMeasure) {
    const Clock::time_point t0 = Clock::now();
    NANOCCL_CHECK(store.set("tune/host/" + std::to_string(t.rank), hostName()));
    Result<LinkProfile> probed = probeLinks(store, t, deadline);
    if (!probed.isOk()) return probed.status().withContext(who + "measuring the links: ");
    if (t.rank == 0) {
      // The others wait for "tune/profile" past their last probe: a failure here is said
      // there, so that they fail at once with it rather than at the deadline.
      Result<std::string> made = measuredProfile(store, t, std::move(probed).value(), path,
                                                 deadline);
      if (!made.isOk()) {
        (void)store.set("tune/profile", kPlanError + made.status().message());
        return made.status().withContext(who);
      }
      text = std::move(made).value();
      NANOCCL_INFO(who << "measured in " << static_cast<int>(secondsSince(t0) * 1000) << " ms");
    }
  }
  if (t.rank == 0) {
    NANOCCL_CHECK(store.set("tune/profile", text));
  } else {
    NANOCCL_ASSIGN_OR_RETURN(text, store.get("tune/profile", deadline));
    if (text.rfind(kPlanError, 0) == 0) {
      return abortedError(who + "rank 0 could not make the profile: " +
                          text.substr(std::string(kPlanError).size()));
    }
  }
  NANOCCL_ASSIGN_OR_RETURN(LinkProfile p, LinkProfile::parse(text, "rank 0's link profile"));
  NANOCCL_INFO(who << p.summary());
  return std::shared_ptr<const LinkProfile>(std::make_shared<LinkProfile>(std::move(p)));
}

}  // namespace nanoccl
