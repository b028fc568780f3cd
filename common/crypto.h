// The few cryptographic primitives nanoccl needs, on OpenSSL's libcrypto: random bytes, a
// keyed MAC (HMAC-SHA256) for proving the job secret without sending it, and an AEAD
// (AES-256-GCM) for the records of an encrypted connection. Nothing here is invented: every
// primitive is OpenSSL's; this file only fixes the choices and gives them Status errors.
//
// Threads: the free functions are thread-safe. An Aead belongs to one connection direction
// and is used by one thread at a time (the transport's progress thread).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace nanoccl::crypto {

constexpr size_t kKeyBytes = 32;    // HMAC-SHA256 keys and AES-256 keys
constexpr size_t kMacBytes = 32;    // HMAC-SHA256 output
constexpr size_t kNonceBytes = 32;  // handshake nonces (fresh per connection)
constexpr size_t kTagBytes = 16;    // GCM authentication tag after each record

using Key = std::array<uint8_t, kKeyBytes>;
using Mac = std::array<uint8_t, kMacBytes>;
using Nonce = std::array<uint8_t, kNonceBytes>;

// Fills `out` from the kernel's CSPRNG (getrandom); an error only if the kernel refuses.
Status randomBytes(void* out, size_t n);

// HMAC-SHA256 over the concatenation of `parts`, each prefixed by its 8-byte length so that
// no two different lists of parts give the same input.
Mac hmac(const Key& key, std::initializer_list<std::string_view> parts);

// A key derived from `key` for one purpose (`label`) and context (`parts`): hmac() of them.
Key derive(const Key& key, std::string_view label, std::initializer_list<std::string_view> parts);

// Equal in time independent of where the bytes differ.
bool equalConstantTime(const void* a, const void* b, size_t n);

// A byte view of a trivially copyable value, for hmac() parts.
template <typename T>
std::string_view bytesOf(const T& v) {
  return {reinterpret_cast<const char*>(&v), sizeof(T)};
}

// AES-256-GCM for one direction of one connection. Record i is sealed with nonce
// (0, 0, 0, 0, i as 8 big-endian bytes): the counter only increases, so a nonce is never used
// twice under one key, and a record replayed, dropped or reordered on the wire fails to open.
class Aead {
 public:
  static Result<Aead> create(const Key& key);
  Aead(Aead&&) noexcept;
  Aead& operator=(Aead&&) noexcept;
  ~Aead();

  // out[0, n) = ciphertext of in[0, n), out[n, n + kTagBytes) = its tag. In-place is allowed.
  Status seal(const void* in, size_t n, void* out);
  // Checks the tag at in[n, n + kTagBytes) and writes the plaintext of in[0, n) to out.
  // kProtocolError when the record was not sealed by the peer's matching Aead at this
  // position (tampered, replayed, reordered or a different key); out is then garbage.
  Status open(const void* in, size_t n, void* out);

  uint64_t recordsDone() const { return counter_; }

 private:
  struct Ctx;
  explicit Aead(std::unique_ptr<Ctx> ctx);
  std::unique_ptr<Ctx> ctx_;
  uint64_t counter_ = 0;
};

}  // namespace nanoccl::crypto
