#include "common/logging.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace nanoccl {

bool parseLogLevel(const char* value, LogLevel* level) {
  static constexpr struct {
    const char* name;
    LogLevel level;
  } kLevels[] = {{"", LogLevel::kWarn},
                 {"NONE", LogLevel::kNone},
                 {"WARN", LogLevel::kWarn},
                 {"INFO", LogLevel::kInfo},
                 {"TRACE", LogLevel::kTrace}};
  for (const auto& l : kLevels) {
    if (strcasecmp(value, l.name) == 0) {
      *level = l.level;
      return true;
    }
  }
  return false;
}

LogLevel logLevel() {
  static const LogLevel level = [] {
    LogLevel l = LogLevel::kWarn;  // also for a malformed value: group creation refuses it
    const char* v = std::getenv("NANOCCL_DEBUG");
    if (v != nullptr) parseLogLevel(v, &l);
    return l;
  }();
  return level;
}

void logLine(LogLevel level, const char* file, int line, const std::string& message) {
  static std::mutex mu;
  static const std::string prefix = [] {
    char host[64] = {0};
    gethostname(host, sizeof(host) - 1);
    return std::string(host) + ":" + std::to_string(getpid());
  }();
  const char* tag = level == LogLevel::kWarn ? "WARN" : level == LogLevel::kInfo ? "INFO" : "TRACE";
  const char* base = std::strrchr(file, '/');
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s NANOCCL %s %s:%d %s\n", prefix.c_str(), tag, base ? base + 1 : file,
               line, message.c_str());
}

}  // namespace nanoccl
