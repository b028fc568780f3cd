// The TCP transport's handshake records. After the handshake, a connection carries frames
// (transports/frame.h). Nothing read from an unauthenticated connection sizes an allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/crypto.h"
#include "transports/frame.h"

namespace nanoccl::tcp {

// Connection setup, four records (the secret itself never crosses the wire):
//   connector -> acceptor  Hello      who I am, my settings, a fresh nonce
//   acceptor  -> connector Challenge  my rank, a fresh nonce, MAC proving I hold the job key
//   connector -> acceptor  Proof      MAC proving I hold the job key
//   acceptor  -> connector HelloAck   accepted, or which settings differ
// Each MAC covers both nonces (challengeMac(), proofMac()), so a recorded handshake replayed
// later fails against the new nonce, and one side's MAC cannot stand in for the other's. The
// acceptor answers a stranger's Hello with a Challenge, but admits nothing without a Proof.
// Both sides then derive one key per direction from the job key and both nonces
// (sessionKeys()), used when the job encrypts (NANOCCL_ENCRYPT).
constexpr uint16_t kHandshakeVersion = 2;

// Hello / HelloAck flags.
constexpr uint32_t kHelloEncrypt = 1;  // this rank encrypts its connections (NANOCCL_ENCRYPT=1)

struct Hello {
  uint32_t magic;
  uint16_t version;      // kHandshakeVersion
  uint16_t socketIndex;  // which of the nsocks connections to the acceptor this is
  int32_t rank;          // the connecting rank
  int32_t size;          // its communicator size
  int32_t nsocks;        // its NANOCCL_NSOCKS
  uint32_t flags;        // kHello* bits
  uint64_t commIdHash;
  uint64_t stripeMinBytes;  // its NANOCCL_STRIPE_MIN_BYTES: striping must agree on both sides
  uint8_t nonce[crypto::kNonceBytes];
};
static_assert(sizeof(Hello) == 72);

struct Challenge {
  uint32_t magic;
  int32_t rank;  // the acceptor's rank
  uint8_t nonce[crypto::kNonceBytes];
  uint8_t mac[crypto::kMacBytes];  // challengeMac()
};
static_assert(sizeof(Challenge) == 72);

struct Proof {
  uint32_t magic;
  uint32_t reserved;
  uint8_t mac[crypto::kMacBytes];  // proofMac()
};
static_assert(sizeof(Proof) == 40);

// The acceptor's answer to a valid Proof. A connection that gives no valid Proof gets no
// answer: it is closed.
enum class HelloVerdict : uint32_t {
  kAccepted = 0,
  kConfigMismatch = 1,  // same job, but nsocks / stripe size / size / encryption disagree
  kDuplicate = 2,
};
struct HelloAck {
  uint32_t magic;
  HelloVerdict verdict;
  int32_t rank;  // the acceptor's rank
  int32_t nsocks;
  uint64_t stripeMinBytes;
  uint32_t flags;  // kHello* bits
  uint32_t reserved;
};
static_assert(sizeof(HelloAck) == 32);

inline crypto::Mac challengeMac(const crypto::Key& jobKey, const Hello& h, const Challenge& c) {
  using crypto::bytesOf;
  return crypto::hmac(jobKey, {"nanoccl tcp acceptor v2", bytesOf(h), bytesOf(c.rank),
                               bytesOf(c.nonce)});
}

inline crypto::Mac proofMac(const crypto::Key& jobKey, const Hello& h, const Challenge& c) {
  using crypto::bytesOf;
  return crypto::hmac(jobKey, {"nanoccl tcp connector v2", bytesOf(h), bytesOf(c.rank),
                               bytesOf(c.nonce)});
}

struct SessionKeys {
  crypto::Key connectorToAcceptor;
  crypto::Key acceptorToConnector;
};

inline SessionKeys sessionKeys(const crypto::Key& jobKey, const Hello& h, const Challenge& c) {
  using crypto::bytesOf;
  return {crypto::derive(jobKey, "nanoccl tcp c->a v2", {bytesOf(h), bytesOf(c.rank),
                                                        bytesOf(c.nonce)}),
          crypto::derive(jobKey, "nanoccl tcp a->c v2", {bytesOf(h), bytesOf(c.rank),
                                                        bytesOf(c.nonce)})};
}

}  // namespace nanoccl::tcp
