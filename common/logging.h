// Logging, NCCL style: NANOCCL_DEBUG=WARN (default) | INFO | TRACE, to stderr, one line each,
// prefixed with host:pid and the rank when known.
#pragma once

#include <sstream>
#include <string>

namespace nanoccl {

enum class LogLevel { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

LogLevel logLevel();  // read from NANOCCL_DEBUG once
// The level a NANOCCL_DEBUG value names (NONE, WARN, INFO, TRACE in any case; empty: WARN), or
// false for anything else (Config::fromEnv() refuses it).
bool parseLogLevel(const char* value, LogLevel* level);
void logLine(LogLevel level, const char* file, int line, const std::string& message);

}  // namespace nanoccl

#define NANOCCL_LOG(level, expr)                                                   \
  do {                                                                             \
    if (::nanoccl::logLevel() >= ::nanoccl::LogLevel::level) {                     \
      std::ostringstream nanoccl_log_os_;                                          \
      nanoccl_log_os_ << expr;                                                     \
      ::nanoccl::logLine(::nanoccl::LogLevel::level, __FILE__, __LINE__,           \
                         nanoccl_log_os_.str());                                   \
    }                                                                              \
  } while (0)

#define NANOCCL_WARN(expr) NANOCCL_LOG(kWarn, expr)
#define NANOCCL_INFO(expr) NANOCCL_LOG(kInfo, expr)
#define NANOCCL_TRACE(expr) NANOCCL_LOG(kTrace, expr)
