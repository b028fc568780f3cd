// The TCP transport's handshake records. After the handshake, a connection carries frames
// (transports/frame.h). Nothing read from an unauthenticated connection sizes an allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/crypto.h"
#include "transports/frame.h"
#include "transports/identity.h"

namespace nanoccl::tcp {

// Connection setup, four records (the secret itself never crosses the wire):
//   connector -> acceptor  Hello      who I am, a fresh nonce
//   acceptor  -> connector Challenge  my rank, a fresh nonce, MAC proving I am a member
//   connector -> acceptor  Proof      MAC proving I am a member
//   acceptor  -> connector HelloAck   accepted, or a duplicate
// Each MAC covers both nonces (challengeMac(), proofMac()), so a recorded handshake replayed
// later fails against the new nonce, and one side's MAC cannot stand in for the other's. The
// acceptor answers a stranger's Hello with a Challenge, but admits nothing without a Proof.
// Membership is the one check every transport makes (CommIdentity, transports/identity.h:
// the job secret and this comm id). Both sides then derive one key per direction from the
// communicator key and both nonces (sessionKeys()), used when the job encrypts
// (NANOCCL_ENCRYPT). Version 3: MACs under the communicator key (v2 used the job key).
// Version 4: rails (nsocks counts every rail's connections) and stripes cut by the rails'
// weights (layout.h), which v3 ranks would reassemble differently. Version 5: the settings
// ranks must share travel in the published address (address.h) and are compared before any
// connection; the Hello and HelloAck no longer carry them.
constexpr uint16_t kHandshakeVersion = 5;

struct Hello {
  uint32_t magic;
  uint16_t version;      // kHandshakeVersion
  uint16_t socketIndex;  // which of the nsocks connections to the acceptor this is
  int32_t rank;          // the connecting rank
  int32_t size;          // its communicator size
  uint64_t commIdHash;
  uint8_t nonce[crypto::kNonceBytes];
};
static_assert(sizeof(Hello) == 56);

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
  kDuplicate = 2,  // that rank's connection of this index is already in
};
struct HelloAck {
  uint32_t magic;
  HelloVerdict verdict;
};
static_assert(sizeof(HelloAck) == 8);

// The acceptor's answer to a Hello, and the connector's proof: both bind the Hello (ranks,
// comm id, connection index) and the acceptor's fresh nonce, so a recorded handshake does not
// verify again (transports/identity.h).
inline crypto::Mac challengeMac(const CommIdentity& id, const Hello& h, const Challenge& c) {
  using crypto::bytesOf;
  return id.prove("nanoccl tcp acceptor v3", {bytesOf(h), bytesOf(c.rank), bytesOf(c.nonce)});
}

inline crypto::Mac proofMac(const CommIdentity& id, const Hello& h, const Challenge& c) {
  using crypto::bytesOf;
  return id.prove("nanoccl tcp connector v3", {bytesOf(h), bytesOf(c.rank), bytesOf(c.nonce)});
}

struct SessionKeys {
  crypto::Key connectorToAcceptor;
  crypto::Key acceptorToConnector;
};

inline SessionKeys sessionKeys(const CommIdentity& id, const Hello& h, const Challenge& c) {
  using crypto::bytesOf;
  return {id.derive("nanoccl tcp c->a v3", {bytesOf(h), bytesOf(c.rank), bytesOf(c.nonce)}),
          id.derive("nanoccl tcp a->c v3", {bytesOf(h), bytesOf(c.rank), bytesOf(c.nonce)})};
}

}  // namespace nanoccl::tcp
