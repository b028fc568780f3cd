// Records on an encrypted connection, as an attacker on the path may forge, cut or replay
// them: Aead::open must reject every one it was not given by the matching sealer, and crash on
// none. The first input byte picks which record number the receiver expects.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/crypto.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nanoccl;
  if (size < 1 + crypto::kTagBytes) return 0;
  static const crypto::Key key = [] {
    crypto::Key k{};
    for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(i * 7 + 1);
    return k;
  }();
  auto rx = crypto::Aead::create(key);
  if (!rx.isOk()) __builtin_trap();
  // Skip to record number data[0] % 4 as a receiver would after earlier records.
  std::vector<uint8_t> scratch(crypto::kTagBytes);
  for (int i = 0; i < data[0] % 4; ++i) (void)rx->open(scratch.data(), 0, scratch.data());
  const size_t n = size - 1 - crypto::kTagBytes;
  std::vector<uint8_t> out(n + 1);
  const Status st = rx->open(data + 1, n, out.data());
  if (st.isOk()) __builtin_trap();  // forging a GCM tag by chance: never
  if (st.code() != StatusCode::kProtocolError) __builtin_trap();
  // And a genuine record still opens after the forgery attempt's position.
  auto tx = crypto::Aead::create(key);
  std::vector<uint8_t> sealed(n + crypto::kTagBytes);
  for (uint64_t i = 0; i < rx->recordsDone(); ++i) (void)tx->seal(data, 0, scratch.data());
  if (!tx->seal(data + 1, n, sealed.data()).isOk()) __builtin_trap();
  if (!rx->open(sealed.data(), n, out.data()).isOk()) __builtin_trap();
  if (n > 0 && std::memcmp(out.data(), data + 1, n) != 0) __builtin_trap();
  return 0;
}
