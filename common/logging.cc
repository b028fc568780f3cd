#include "common/logging.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace nanoccl {

LogLevel logLevel() {
  static const LogLevel level = [] {
    const char* v = std::getenv("NANOCCL_DEBUG");
    if (v == nullptr) return LogLevel::kWarn;
    if (strcasecmp(v, "NONE") == 0) return LogLevel::kNone;
    if (strcasecmp(v, "INFO") == 0) return LogLevel::kInfo;
    if (strcasecmp(v, "TRACE") == 0) return LogLevel::kTrace;
    return LogLevel::kWarn;
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
