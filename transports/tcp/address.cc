#include "transports/tcp/address.h"

#include <cstdint>
#include <optional>

#include "common/strings.h"

namespace nanoccl::tcp {

std::string formatRails(const std::vector<RailAddress>& rails, const std::string& settings) {
  std::string out;
  for (const RailAddress& r : rails) {
    if (!out.empty()) out += ',';
    out += r.address.toString();
    if (r.mbps > 0) {
      out += '@';
      out += std::to_string(r.mbps);
    }
  }
  return settings.empty() ? out : out + ' ' + settings;
}

Result<std::vector<RailAddress>> parseRails(const std::string& text) {
  std::vector<RailAddress> out;
  for (std::string item : splitList(text.substr(0, text.find(' ')))) {
    RailAddress& r = out.emplace_back();
    if (const size_t at = item.find('@'); at != std::string::npos) {
      const std::optional<int64_t> mbps = parseDecimal(item.substr(at + 1), 1, kMaxRailMbps);
      if (!mbps) return invalidArgument("bad rail rate in '" + text + "'");
      r.mbps = *mbps;
      item.resize(at);
    }
    NANOCCL_ASSIGN_OR_RETURN(r.address, SocketAddress::parse(item));
  }
  return out;
}

std::string publishedSettings(const std::string& text) {
  const size_t space = text.find(' ');
  return space == std::string::npos ? std::string() : text.substr(space + 1);
}

}  // namespace nanoccl::tcp
