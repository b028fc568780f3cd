#include "collectives/tuning.h"

#include <fcntl.h>
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

#include "collectives/codec/codec.h"
#include "collectives/tuning_probe.h"
#include "common/logging.h"
#include "common/reduce.h"

namespace nanoccl {
namespace {

using Clock = std::chrono::steady_clock;

using tuning_probe::secondsSince;

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

constexpr off_t kMaxProfileBytes = 64 << 10;

// Rank 0's decision, handed to the others under "tune/plan".
constexpr const char* kPlanOff = "off";
constexpr const char* kPlanUse = "use";
constexpr const char* kPlanMeasure = "measure";
constexpr const char* kPlanError = "error: ";

}  // namespace

std::string LinkProfile::toText() const {
  std::string s =
      "# nanoccl link profile (docs/tuning.md): latencies in us, rates in MB/s (10^6 B/s)\n";
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
  NANOCCL_ASSIGN_OR_RETURN(p.cpuShare, tuning_probe::cpuShareOfRankZero(store, t.size, deadline));
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
    NANOCCL_CHECK(store.set("tune/host/" + std::to_string(t.rank), tuning_probe::hostName()));
    Result<LinkProfile> probed = tuning_probe::probeLinks(store, t, deadline);
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
