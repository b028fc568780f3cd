// CommIdentity: who belongs to one communicator, checked the same way by every transport.
//
// A member holds the job secret (common/secret.h) and speaks for one communicator id. The
// communicator key is derived from the job key and the comm id, so a proof made for one
// communicator (or one job) never verifies for another; each transport then proves and checks
// membership with a keyed MAC under it, over its own label and the context it binds (ranks,
// fresh nonces, a segment's name and creator):
// - tcp: the handshake's challenge and proof, and the session keys (transports/tcp/wire.h);
// - shm: the proof in each segment's header (transports/shm/segment.h);
// - fabric: the token every frame carries (transports/fabric/wire.h).
// None of them sends or stores the secret or a key.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>

#include "common/crypto.h"
#include "common/secret.h"
#include "transports/frame.h"

namespace nanoccl {

class CommIdentity {
 public:
  CommIdentity(const std::string& secret, const std::string& commId)
      : key_(crypto::derive(jobKey(secret), "nanoccl communicator v3", {commId})),
        commHash_(hashCommId(commId)) {}

  // The comm id's hash, sent in the clear so that a peer of another communicator is told so
  // (and not that it holds the wrong secret).
  uint64_t commHash() const { return commHash_; }

  // A proof that a member made `context` for `label` (a transport's own, e.g. "tcp acceptor").
  // Proofs and keys live in separate label spaces: no proof ever equals a derived key.
  crypto::Mac prove(std::string_view label, std::initializer_list<std::string_view> context) const {
    const crypto::Key k = crypto::derive(key_, "proof: " + std::string(label), context);
    crypto::Mac mac;
    static_assert(sizeof(mac) == sizeof(k));
    std::memcpy(mac.data(), k.data(), mac.size());
    return mac;
  }

  // Whether `proof` (its first `bytes`, from kMinProofBytes to a whole MAC: tokens may be
  // cut short) is prove(label, context); in time independent of where it differs.
  static constexpr size_t kMinProofBytes = 16;
  bool verify(std::string_view label, std::initializer_list<std::string_view> context,
              const void* proof, size_t bytes) const {
    const crypto::Mac expected = prove(label, context);
    return bytes >= kMinProofBytes && bytes <= expected.size() &&
           crypto::equalConstantTime(expected.data(), proof, bytes);
  }

  // A key for one purpose (`label`) bound to `context`: session keys.
  crypto::Key derive(std::string_view label, std::initializer_list<std::string_view> context) const {
    return crypto::derive(key_, "key: " + std::string(label), context);
  }

 private:
  crypto::Key key_;
  uint64_t commHash_;
};

}  // namespace nanoccl
