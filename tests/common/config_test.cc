#include "common/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <stdlib.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nanoccl {
namespace {

// Sets environment variables for one test and restores the previous values afterwards.
class ScopedEnv {
 public:
  ScopedEnv() = default;
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        unsetenv(it->first.c_str());
      }
    }
  }
  void set(const std::string& name, const std::string& value) {
    remember(name);
    setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) {
    remember(name);
    unsetenv(name.c_str());
  }

 private:
  void remember(const std::string& name) {
    const char* old = getenv(name.c_str());
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

const char* kNames[] = {"socket_ifname",       "rail_mbps",  "rail_per_local_rank",
                        "tcp_engine", "tcp_congestion", "nsocks",
                        "stripe_min_bytes",    "algo",       "chunk_bytes",
                        "small_message_bytes", "spin_us", "timeout_ms", "connect_timeout_ms",
                        "node_id",             "transport",  "intra_transport", "compression",
                        "compression_allow",
                        "compression_min_bytes", "compression_block", "secret_file",
                        "secret",              "encrypt",    "tuning",
                        "tuning_file"};

std::string envName(const std::string& field) {
  std::string s = "NANOCCL_";
  for (char c : field) s += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Clears every NANOCCL_* setting so the machine's environment cannot leak into a test.
void clearAll(ScopedEnv& env) {
  for (const char* n : kNames) env.unset(envName(n));
}

std::map<std::string, std::string> asMap(const Config& c) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : c.items()) m[k] = v;
  return m;
}

TEST(ConfigTest, DefaultsAndTableOrder) {
  const Config c;
  const auto items = c.items();
  ASSERT_EQ(items.size(), std::size(kNames));
  for (size_t i = 0; i < items.size(); ++i) EXPECT_EQ(items[i].first, kNames[i]);
  const auto m = asMap(c);
  EXPECT_EQ(m.at("socket_ifname"), "");
  EXPECT_EQ(m.at("rail_mbps"), "");
  EXPECT_EQ(m.at("tcp_engine"), "auto");
  EXPECT_EQ(m.at("tcp_congestion"), "auto");
  EXPECT_EQ(m.at("nsocks"), "2");
  EXPECT_EQ(m.at("stripe_min_bytes"), "262144");
  EXPECT_EQ(m.at("algo"), "auto");
  EXPECT_EQ(m.at("chunk_bytes"), "1048576");
  EXPECT_EQ(m.at("small_message_bytes"), "65536");
  EXPECT_EQ(m.at("timeout_ms"), "300000");
  EXPECT_EQ(m.at("connect_timeout_ms"), "60000");
  EXPECT_EQ(m.at("compression"), "none");
  EXPECT_EQ(m.at("compression_min_bytes"), "1048576");
  EXPECT_EQ(m.at("compression_block"), "0");
}

TEST(ConfigTest, CompressionSettingsAreChecked) {
  Config c;
  EXPECT_TRUE(c.set("NANOCCL_COMPRESSION", "int4").isOk());
  EXPECT_EQ(c.compression, "int4");
  const Status bad = c.set("compression", "int9");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.message().find("none|fp16|bf16|int8|int4"), std::string::npos) << bad.toString();
  EXPECT_EQ(c.compression, "int4");
  EXPECT_TRUE(c.set("compression_block", "256").isOk());
  EXPECT_EQ(c.compressionBlock, 256);
  for (const char* v : {"100", "-32", "2097152", "x"}) {
    const Status s = c.set("compression_block", v);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << v;
  }
  EXPECT_EQ(c.compressionBlock, 256);
  EXPECT_TRUE(c.set("compression_min_bytes", "0").isOk());
  EXPECT_EQ(c.compressionMinBytes, 0u);
}

TEST(ConfigTest, FromEnvWithNothingSetGivesDefaults) {
  ScopedEnv env;
  clearAll(env);
  const Result<Config> c = Config::fromEnv();
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(asMap(c.value()), asMap(Config()));
}

TEST(ConfigTest, FromEnvReadsEverySetting) {
  ScopedEnv env;
  clearAll(env);
  env.set("NANOCCL_SOCKET_IFNAME", "^docker,lo");
  env.set("NANOCCL_RAIL_MBPS", "25000,1000");
  env.set("NANOCCL_TCP_ENGINE", "epoll");
  env.set("NANOCCL_NSOCKS", "4");
  env.set("NANOCCL_STRIPE_MIN_BYTES", "1000");
  env.set("NANOCCL_ALGO", "ring");
  env.set("NANOCCL_CHUNK_BYTES", "524288");
  env.set("NANOCCL_SMALL_MESSAGE_BYTES", "0");
  env.set("NANOCCL_TIMEOUT_MS", "1234");
  env.set("NANOCCL_CONNECT_TIMEOUT_MS", "5678");
  env.set("NANOCCL_SECRET_FILE", "/etc/nanoccl/secret");
  env.set("NANOCCL_ENCRYPT", "1");
  const Result<Config> r = Config::fromEnv();
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  const Config& c = r.value();
  EXPECT_EQ(c.socketIfname, "^docker,lo");
  EXPECT_EQ(c.railMbps, (std::vector<int64_t>{25000, 1000}));
  EXPECT_EQ(c.tcpEngine, "epoll");
  EXPECT_EQ(c.nsocks, 4);
  EXPECT_EQ(c.stripeMinBytes, 1000u);
  EXPECT_EQ(c.algo, "ring");
  EXPECT_EQ(c.chunkBytes, 524288u);
  EXPECT_EQ(c.smallMessageBytes, 0u);
  EXPECT_EQ(c.timeoutMs, 1234);
  EXPECT_EQ(c.connectTimeoutMs, 5678);
  EXPECT_EQ(c.secretFile, "/etc/nanoccl/secret");
  EXPECT_TRUE(c.encrypt);
}

TEST(ConfigTest, FromEnvRejectsMalformedValuesNamingTheVariable) {
  const std::pair<const char*, const char*> bad[] = {
      {"NANOCCL_NSOCKS", "abc"},         {"NANOCCL_NSOCKS", "4x"},
      {"NANOCCL_NSOCKS", "0"},           {"NANOCCL_NSOCKS", "-1"},
      {"NANOCCL_NSOCKS", ""},            {"NANOCCL_TCP_ENGINE", "io_uring"},
      {"NANOCCL_CHUNK_BYTES", "1023"},   {"NANOCCL_TIMEOUT_MS", "0"},
      {"NANOCCL_TIMEOUT_MS", "1.5"},     {"NANOCCL_STRIPE_MIN_BYTES", "99999999999999999999"},
      {"NANOCCL_CONNECT_TIMEOUT_MS", "ten"},
      {"NANOCCL_RAIL_MBPS", "1000,"},    {"NANOCCL_RAIL_MBPS", ","},
      {"NANOCCL_RAIL_MBPS", "1000;100"}, {"NANOCCL_RAIL_MBPS", "0"},
      {"NANOCCL_RAIL_MBPS", "1g,100"},
      // Read once per process by their own modules (logging, the reduction kernels), but
      // checked here like every setting: a typo fails the group's creation.
      {"NANOCCL_DEBUG", "LOUD"},         {"NANOCCL_DEBUG", "1"},
      {"NANOCCL_DEBUG", "warning"},      {"NANOCCL_REDUCE_ISA", "avx9000"},
      {"NANOCCL_REDUCE_ISA", "sse"},
  };
  for (const auto& [name, value] : bad) {
    ScopedEnv env;
    clearAll(env);
    env.set(name, value);
    const Result<Config> r = Config::fromEnv();
    ASSERT_FALSE(r.isOk()) << name << "=" << value;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(name), std::string::npos) << r.status().message();
  }
}

// The process-wide settings' valid values (the bad ones are in the test above).
TEST(ConfigTest, FromEnvAcceptsTheProcessWideSettings) {
  const std::pair<const char*, const char*> good[] = {
      {"NANOCCL_DEBUG", "info"},      {"NANOCCL_DEBUG", "TRACE"},    {"NANOCCL_DEBUG", "none"},
      {"NANOCCL_DEBUG", "WARN"},      {"NANOCCL_DEBUG", ""},         {"NANOCCL_REDUCE_ISA", "scalar"},
      {"NANOCCL_REDUCE_ISA", "AVX2"}, {"NANOCCL_REDUCE_ISA", "avx512"}, {"NANOCCL_REDUCE_ISA", ""},
  };
  for (const auto& [name, value] : good) {
    ScopedEnv env;
    clearAll(env);
    env.set(name, value);
    EXPECT_TRUE(Config::fromEnv().isOk()) << name << "=" << value;
  }
}

TEST(ConfigTest, SetAcceptsBothNames) {
  Config c;
  ASSERT_TRUE(c.set("nsocks", "3").isOk());
  EXPECT_EQ(c.nsocks, 3);
  ASSERT_TRUE(c.set("NANOCCL_NSOCKS", "5").isOk());
  EXPECT_EQ(c.nsocks, 5);
  ASSERT_TRUE(c.set("tcp_engine", "uring").isOk());
  EXPECT_EQ(c.tcpEngine, "uring");
  ASSERT_TRUE(c.set("NANOCCL_TCP_ENGINE", "auto").isOk());
  EXPECT_EQ(c.tcpEngine, "auto");
  ASSERT_TRUE(c.set("NANOCCL_SOCKET_IFNAME", "=eth0").isOk());
  EXPECT_EQ(c.socketIfname, "=eth0");
  ASSERT_TRUE(c.set("timeout_ms", "10").isOk());
  EXPECT_EQ(c.timeoutMs, 10);
  for (const char* n : kNames) {
    // Every field can be set under both names with the value it prints.
    const std::string value = asMap(c).at(n);
    EXPECT_TRUE(c.set(n, value).isOk()) << n;
    EXPECT_TRUE(c.set(envName(n), value).isOk()) << envName(n);
  }
}

TEST(ConfigTest, TcpCongestionEmptyMeansTheHostsDefault) {
  Config c;
  EXPECT_EQ(c.tcpCongestion, "auto");
  ASSERT_TRUE(c.set("tcp_congestion", "").isOk());
  EXPECT_EQ(c.tcpCongestion, "host");
  ASSERT_TRUE(c.set("tcp_congestion", "cubic").isOk());
  EXPECT_EQ(c.tcpCongestion, "cubic");
}

TEST(ConfigTest, SetRejectsBadValuesAndKeepsTheOldOne) {
  Config c;
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"nsocks", "zero"}, {"nsocks", "0"}, {"NANOCCL_NSOCKS", "2.0"},
           {"tcp_engine", "EPOLL"}, {"chunk_bytes", "-4096"}, {"timeout_ms", ""},
           {"tcp_congestion", "Cubic"}, {"tcp_congestion", "reno bbr"},
           {"NANOCCL_TCP_CONGESTION", "a_name_longer_than_15"}}) {
    const Config before = c;
    const Status s = c.set(name, value);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << "=" << value;
    EXPECT_EQ(asMap(c), asMap(before)) << name << "=" << value;
  }
}

TEST(ConfigTest, SetRejectsUnknownNamesListingTheKnownOnes) {
  Config c;
  const Status s = c.set("NANOCCL_NSOCK", "2");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("NANOCCL_NSOCK"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("nsocks"), std::string::npos) << s.message();
  EXPECT_FALSE(c.set("", "1").isOk());
}

TEST(ConfigTest, LogOncePrintsTheConfigurationOncePerProcessAtInfo) {
  // In a fresh process (the level is read once, the line printed once per process).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("NANOCCL_DEBUG", "INFO", 1);
        Config c;
        c.secret = "never-print-this-secret";
        ::testing::internal::CaptureStderr();
        c.logOnce();
        c.logOnce();
        Config().logOnce();
        const std::string out = ::testing::internal::GetCapturedStderr();
        size_t lines = 0;
        for (size_t at = out.find("configuration:"); at != std::string::npos;
             at = out.find("configuration:", at + 1)) {
          ++lines;
        }
        const bool ok = lines == 1 && out.find("nsocks=2") != std::string::npos &&
                        out.find("never-print") == std::string::npos;
        std::fprintf(stderr, "%s", ok ? "" : out.c_str());
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(ConfigTest, IntegersOutOfRangeOrPaddedAreRejectedNotTruncated) {
  Config c;
  for (const char* v : {"4294967297", " 4", "4 ", "+4", "0", "65", "0x4", ""}) {
    const Status st = c.set("nsocks", v);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "nsocks=" << v;
    EXPECT_NE(st.message().find("[1, 64]"), std::string::npos) << st.message();
  }
  EXPECT_EQ(c.nsocks, Config().nsocks);
  EXPECT_TRUE(c.set("nsocks", "64").isOk());
  EXPECT_EQ(c.nsocks, 64);
  EXPECT_FALSE(c.set("chunk_bytes", "-5").isOk());
  EXPECT_FALSE(c.set("timeout_ms", "99999999999999999999999").isOk());
}

}  // namespace
}  // namespace nanoccl
