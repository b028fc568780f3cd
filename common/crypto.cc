#include "common/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>

namespace nanoccl::crypto {

Status randomBytes(void* out, size_t n) {
  auto* p = static_cast<char*>(out);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(p + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return systemError("getrandom", errno);
    }
    got += static_cast<size_t>(r);
  }
  return Status::ok();
}

namespace {

// Appends each part after its 8-byte length: no two lists of parts give the same bytes.
void appendLengthPrefixed(std::string& out, std::initializer_list<std::string_view> parts) {
  for (std::string_view part : parts) {
    const uint64_t len = part.size();
    out.append(reinterpret_cast<const char*>(&len), sizeof(len));
    out.append(part);
  }
}

}  // namespace

Mac hmac(const Key& key, std::initializer_list<std::string_view> parts) {
  std::string input;
  appendLengthPrefixed(input, parts);
  Mac out{};
  unsigned int outLen = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), out.data(), &outLen);
  OPENSSL_cleanse(input.data(), input.size());
  return out;
}

Key derive(const Key& key, std::string_view label, std::initializer_list<std::string_view> parts) {
  std::string input(label);
  appendLengthPrefixed(input, parts);
  const Mac m = hmac(key, {input});
  Key out;
  static_assert(sizeof(out) == sizeof(m));
  std::memcpy(out.data(), m.data(), out.size());
  return out;
}

bool equalConstantTime(const void* a, const void* b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

struct Aead::Ctx {
  EVP_CIPHER_CTX* ctx = nullptr;
  ~Ctx() { EVP_CIPHER_CTX_free(ctx); }
};

Aead::Aead(std::unique_ptr<Ctx> ctx) : ctx_(std::move(ctx)) {}
Aead::Aead(Aead&&) noexcept = default;
Aead& Aead::operator=(Aead&&) noexcept = default;
Aead::~Aead() = default;

Result<Aead> Aead::create(const Key& key) {
  auto c = std::make_unique<Ctx>();
  c->ctx = EVP_CIPHER_CTX_new();
  // The key schedule is computed once here; each record then only sets its nonce.
  if (c->ctx == nullptr ||
      EVP_CipherInit_ex(c->ctx, EVP_aes_256_gcm(), nullptr, key.data(), nullptr, 1) != 1) {
    return internalError("AES-256-GCM is not available from OpenSSL");
  }
  return Aead(std::move(c));
}

namespace {

std::array<unsigned char, 12> nonceFor(uint64_t counter) {
  std::array<unsigned char, 12> iv{};
  for (int i = 0; i < 8; ++i) iv[4 + i] = static_cast<unsigned char>(counter >> (56 - 8 * i));
  return iv;
}

}  // namespace

Status Aead::seal(const void* in, size_t n, void* out) {
  const auto iv = nonceFor(counter_++);
  EVP_CIPHER_CTX* ctx = ctx_->ctx;
  auto* o = static_cast<unsigned char*>(out);
  int len = 0;
  int tail = 0;
  if (EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, iv.data(), 1) != 1 ||
      (n > 0 && EVP_CipherUpdate(ctx, o, &len, static_cast<const unsigned char*>(in),
                                 static_cast<int>(n)) != 1) ||
      EVP_CipherFinal_ex(ctx, o + len, &tail) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kTagBytes, o + n) != 1) {
    return internalError("AES-256-GCM encryption failed");
  }
  return Status::ok();
}

Status Aead::open(const void* in, size_t n, void* out) {
  const auto iv = nonceFor(counter_++);
  EVP_CIPHER_CTX* ctx = ctx_->ctx;
  const auto* i = static_cast<const unsigned char*>(in);
  auto* o = static_cast<unsigned char*>(out);
  unsigned char tag[kTagBytes];
  std::memcpy(tag, i + n, kTagBytes);  // before an in-place open could overwrite it
  int len = 0;
  int tail = 0;
  if (EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, iv.data(), 0) != 1 ||
      (n > 0 && EVP_CipherUpdate(ctx, o, &len, i, static_cast<int>(n)) != 1) ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) != 1) {
    return internalError("AES-256-GCM decryption failed");
  }
  if (EVP_CipherFinal_ex(ctx, o + len, &tail) != 1) {
    return protocolError("record " + std::to_string(counter_ - 1) +
                         " failed authentication (tampered, replayed, reordered, or sealed "
                         "with another key)");
  }
  return Status::ok();
}

}  // namespace nanoccl::crypto
