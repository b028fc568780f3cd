// Formatting and parsing a rank's published fabric address (address.h).
#include "transports/fabric/address.h"

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
  if (s.size() % 2 != 0) return false;
  out->clear();
  for (size_t i = 0; i < s.size(); i += 2) {
    int v = 0;
    for (size_t k = i; k < i + 2; ++k) {
      const char c = s[k];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + d;
    }
    out->push_back(static_cast<uint8_t>(v));
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
