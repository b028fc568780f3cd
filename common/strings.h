// Small string helpers shared by the settings and the transports.
#pragma once

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace nanoccl {

// `text` cut at every `sep`, empty items kept ("a,,b" -> a, "", b; "" -> one empty item), so
// that each caller decides what an empty item means.
inline std::vector<std::string> splitList(const std::string& text, char sep = ',') {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t end = text.find(sep, pos);
    out.push_back(text.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) return out;
    pos = end + 1;
  }
}

// `text` as a decimal integer in [min, max]: digits, after a '-' at most, and nothing else (no
// spaces, '+' or suffixes); nullopt for anything else, or out of range.
inline std::optional<int64_t> parseDecimal(const std::string& text, int64_t min, int64_t max) {
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-')) {
    return std::nullopt;
  }
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || x < min || x > max) return std::nullopt;
  return static_cast<int64_t>(x);
}

}  // namespace nanoccl
