// Formatting and parsing a rank's published fabric address (address.h).
#include "transports/fabric/address.h"

#include <string>

namespace nanoccl::fabric {
namespace {

std::string toHex(const void* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = static_cast<const uint8_t*>(p)[i];
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

bool fromHex(const std::string& s, std::vector<uint8_t>* out) {
  out->clear();
  if (s.size() % 2 != 0 || s.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return false;
  }
  for (size_t i = 0; i < s.size(); i += 2) {
    out->push_back(static_cast<uint8_t>(std::stoul(s.substr(i, 2), nullptr, 16)));
  }
  return true;
}

}  // namespace

std::string formatAddress(const void* name, size_t nameBytes, const uint8_t* nonce) {
  return "fabric:" + toHex(name, nameBytes) + ":" + toHex(nonce, kNonceBytes);
}

bool parseAddress(const std::string& text, std::vector<uint8_t>* name,
                  std::vector<uint8_t>* nonce) {
  const size_t colon = text.find(':', 7);
  if (text.rfind("fabric:", 0) != 0 || colon == std::string::npos) return false;
  if (!fromHex(text.substr(7, colon - 7), name) || !fromHex(text.substr(colon + 1), nonce)) {
    return false;
  }
  return !name->empty() && nonce->size() == kNonceBytes;
}

}  // namespace nanoccl::fabric
