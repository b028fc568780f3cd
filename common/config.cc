#include "common/config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <limits>
#include <mutex>

#include "common/logging.h"
#include "common/op.h"
#include "common/reduce.h"
#include "common/strings.h"

namespace nanoccl {
namespace {

// A decimal integer in [min, max] (parseDecimal), or an error naming the setting.
Result<int64_t> parseInt(const std::string& name, const std::string& v, int64_t min,
                         int64_t max) {
  if (const std::optional<int64_t> x = parseDecimal(v, min, max)) return *x;
  return invalidArgument(name + "=" + v + ": expected an integer in [" + std::to_string(min) +
                         ", " + std::to_string(max) + "]");
}

Status oneOf(const std::string& name, const std::string& v, std::initializer_list<const char*> ok) {
  for (const char* o : ok) {
    if (v == o) return Status::ok();
  }
  std::string all;
  for (const char* o : ok) all += std::string(all.empty() ? "" : "|") + o;
  return invalidArgument(name + "=" + v + ": expected one of " + all);
}

}  // namespace

Result<std::vector<std::string>> splitCodecList(const std::string& v) {
  std::vector<std::string> out;
  std::string all;
  for (const char* name : kCodecNames) all += std::string(all.empty() ? "" : ", ") + name;
  for (const std::string& name : splitList(v)) {
    bool known = false;
    for (const char* n : kCodecNames) known = known || name == n;
    if (!known) {
      return invalidArgument("compression_allow=" + v + ": '" + name +
                             "' is not a codec (a comma-separated list of " + all + ")");
    }
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

namespace {

// One row per setting (docs/design.md, convention 3): its name, how to set it, how to print it.
struct Field {
  const char* name;
  std::function<Status(Config&, const std::string&)> set;
  std::function<std::string(const Config&)> get;
};

// An integer setting; the range is also clamped to what the field's type holds.
template <typename T>
Field intField(const char* name, T Config::*member, int64_t min,
               int64_t max = std::numeric_limits<int64_t>::max()) {
  if (static_cast<uint64_t>(max) > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
    max = static_cast<int64_t>(std::numeric_limits<T>::max());
  }
  return {name,
          [=](Config& c, const std::string& v) {
            NANOCCL_ASSIGN_OR_RETURN(const int64_t x, parseInt(name, v, min, max));
            c.*member = static_cast<T>(x);
            return Status::ok();
          },
          [=](const Config& c) { return std::to_string(c.*member); }};
}

Field boolField(const char* name, bool Config::*member) {
  return {name,
          [=](Config& c, const std::string& v) {
            if (v == "1" || v == "true") {
              c.*member = true;
            } else if (v == "0" || v == "false") {
              c.*member = false;
            } else {
              return invalidArgument(std::string(name) + "=" + v + ": expected 0 or 1");
            }
            return Status::ok();
          },
          [=](const Config& c) { return std::string(c.*member ? "1" : "0"); }};
}

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      {"socket_ifname",
       [](Config& c, const std::string& v) {
         c.socketIfname = v;
         return Status::ok();
       },
       [](const Config& c) { return c.socketIfname; }},
      {"rail_mbps",
       [](Config& c, const std::string& v) {
         std::vector<int64_t> rates;
         for (const std::string& item : v.empty() ? std::vector<std::string>{} : splitList(v)) {
           NANOCCL_ASSIGN_OR_RETURN(const int64_t x,
                                    parseInt("rail_mbps", item, 1, kMaxRailMbps));
           rates.push_back(x);
         }
         c.railMbps = std::move(rates);
         return Status::ok();
       },
       [](const Config& c) {
         std::string out;
         for (const int64_t x : c.railMbps) {
           if (!out.empty()) out += ',';
           out += std::to_string(x);
         }
         return out;
       }},
      boolField("rail_per_local_rank", &Config::railPerLocalRank),
      {"tcp_engine",
       [](Config& c, const std::string& v) {
         NANOCCL_CHECK(oneOf("tcp_engine", v, {"auto", "uring", "epoll"}));
         c.tcpEngine = v;
         return Status::ok();
       },
       [](const Config& c) { return c.tcpEngine; }},
      {"tcp_congestion",
       [](Config& c, const std::string& v) {
         // "auto", "host" (empty too: the host's default) or a kernel algorithm's name
         // (TCP_CA_NAME_MAX is 16 with the terminator); whether the kernel has and allows it
         // is checked where the sockets are made.
         if (v.empty()) {
           c.tcpCongestion = "host";
           return Status::ok();
         }
         const bool ok = v.size() < 16 && std::all_of(v.begin(), v.end(), [](char ch) {
           return std::islower(static_cast<unsigned char>(ch)) ||
                  std::isdigit(static_cast<unsigned char>(ch)) || ch == '_';
         });
         if (!ok) {
           return invalidArgument("tcp_congestion=" + v +
                                  ": expected auto, host (the host's default) or an "
                                  "algorithm's name (cubic, reno, bbr, ...)");
         }
         c.tcpCongestion = v;
         return Status::ok();
       },
       [](const Config& c) { return c.tcpCongestion; }},
      {"nsocks",
       [](Config& c, const std::string& v) {
         NANOCCL_ASSIGN_OR_RETURN(const int64_t x, parseInt("nsocks", v, 1, 64));
         c.nsocks = static_cast<int>(x);
         c.nsocksSet = true;  // forced: the planner does not choose the sockets
         return Status::ok();
       },
       [](const Config& c) { return std::to_string(c.nsocks); }},
      intField("stripe_min_bytes", &Config::stripeMinBytes, 1),
      {"algo",
       [](Config& c, const std::string& v) {
         c.algo = v;  // validated by the planner, which owns the algorithm table
         return Status::ok();
       },
       [](const Config& c) { return c.algo; }},
      {"chunk_bytes",
       [](Config& c, const std::string& v) {
         NANOCCL_ASSIGN_OR_RETURN(const int64_t x, parseInt("chunk_bytes", v, 1024,
                                                            std::numeric_limits<int64_t>::max()));
         c.chunkBytes = static_cast<size_t>(x);
         c.chunkBytesSet = true;  // forced: the planner does not choose the chunk
         return Status::ok();
       },
       [](const Config& c) { return std::to_string(c.chunkBytes); }},
      intField("small_message_bytes", &Config::smallMessageBytes, 0),
      intField("spin_us", &Config::spinUs, 0, 1000000),
      intField("timeout_ms", &Config::timeoutMs, 1),
      intField("connect_timeout_ms", &Config::connectTimeoutMs, 1),
      {"node_id",
       [](Config& c, const std::string& v) {
         c.nodeId = v;
         return Status::ok();
       },
       [](const Config& c) { return c.nodeId; }},
      {"transport",
       [](Config& c, const std::string& v) {
         // Which names exist and are built is the transport table's to say (chooseTransports).
         if (v.empty()) return invalidArgument("transport: empty (auto, tcp, fabric, ...)");
         c.transport = v;
         return Status::ok();
       },
       [](const Config& c) { return c.transport; }},
      {"intra_transport",
       [](Config& c, const std::string& v) {
         // Checked against the transport table with `transport` (chooseTransports).
         if (v.empty()) return invalidArgument("intra_transport: empty (auto, shm, tcp, ...)");
         c.intraTransport = v;
         return Status::ok();
       },
       [](const Config& c) { return c.intraTransport; }},
      {"compression",
       [](Config& c, const std::string& v) {
         bool known = v == "auto";
         std::string all;
         for (const char* name : kCodecNames) {
           known = known || v == name;
           all += std::string(all.empty() ? "" : "|") + name;
         }
         if (!known) return invalidArgument("compression=" + v + ": expected one of " + all + "|auto");
         c.compression = v;
         return Status::ok();
       },
       [](const Config& c) { return c.compression; }},
      {"compression_allow",
       [](Config& c, const std::string& v) {
         NANOCCL_CHECK(splitCodecList(v).status());
         c.compressionAllow = v;
         return Status::ok();
       },
       [](const Config& c) { return c.compressionAllow; }},
      intField("compression_min_bytes", &Config::compressionMinBytes, 0),
      {"compression_block",
       [](Config& c, const std::string& v) {
         NANOCCL_ASSIGN_OR_RETURN(const int64_t x, parseInt("compression_block", v, 0, 1 << 20));
         if (x % 32 != 0) {
           return invalidArgument("compression_block=" + v +
                                  ": expected 0 (the codec's default) or a multiple of 32");
         }
         c.compressionBlock = static_cast<int>(x);
         return Status::ok();
       },
       [](const Config& c) { return std::to_string(c.compressionBlock); }},
      {"secret_file",
       [](Config& c, const std::string& v) {
         c.secretFile = v;  // read and checked at communicator creation (common/secret.h)
         return Status::ok();
       },
       [](const Config& c) { return c.secretFile; }},
      {"secret",
       [](Config& c, const std::string& v) {
         c.secret = v;
         return Status::ok();
       },
       [](const Config& c) { return std::string(c.secret.empty() ? "" : "(set)"); }},
      boolField("encrypt", &Config::encrypt),
      {"tuning",
       [](Config& c, const std::string& v) {
         NANOCCL_CHECK(oneOf("tuning", v, {"off", "cached", "measure"}));
         c.tuning = v;
         return Status::ok();
       },
       [](const Config& c) { return c.tuning; }},
      {"tuning_file",
       [](Config& c, const std::string& v) {
         c.tuningFile = v;  // read (or written) by rank 0 at communicator creation
         return Status::ok();
       },
       [](const Config& c) { return c.tuningFile; }},
  };
  return table;
}

std::string normalize(const std::string& name) {
  std::string n = name;
  if (n.rfind("NANOCCL_", 0) == 0) n = n.substr(8);
  for (char& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return n;
}

}  // namespace

Result<Config> Config::fromEnv() {
  // Read once per process by their own modules, so not fields: checked here all the same, so
  // that a typo fails the group's creation like any other malformed setting.
  if (const char* v = std::getenv("NANOCCL_DEBUG")) {
    LogLevel level;
    if (!parseLogLevel(v, &level)) {
      return invalidArgument(std::string("NANOCCL_DEBUG=") + v +
                             ": expected one of NONE|WARN|INFO|TRACE");
    }
  }
  if (const char* v = std::getenv("NANOCCL_REDUCE_ISA"); v != nullptr && !knownReduceIsa(v)) {
    return invalidArgument(std::string("NANOCCL_REDUCE_ISA=") + v +
                           ": expected one of scalar|avx2|avx512");
  }
  Config c;
  for (const Field& f : fields()) {
    std::string env = "NANOCCL_";
    for (const char* p = f.name; *p; ++p) env += static_cast<char>(std::toupper(*p));
    if (const char* v = std::getenv(env.c_str())) {
      NANOCCL_CHECK(f.set(c, v).withContext(env + ": "));
    }
  }
  return c;
}

Status Config::set(const std::string& name, const std::string& value) {
  const std::string n = normalize(name);
  for (const Field& f : fields()) {
    if (n == f.name) return f.set(*this, value);
  }
  std::string all;
  for (const Field& f : fields()) all += std::string(all.empty() ? "" : ", ") + f.name;
  return invalidArgument("unknown nanoccl setting '" + name + "' (known: " + all + ")");
}

std::vector<std::pair<std::string, std::string>> Config::items() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Field& f : fields()) out.emplace_back(f.name, f.get(*this));
  return out;
}

void Config::logOnce() const {
  static std::once_flag once;
  std::call_once(once, [this] {
    std::string line = "configuration:";
    for (const auto& [k, v] : items()) line += " " + k + "=" + v;
    NANOCCL_INFO(line);
  });
}

}  // namespace nanoccl
