// Small string helpers shared by the settings and the transports.
#pragma once

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

}  // namespace nanoccl
