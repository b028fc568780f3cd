// CommIdentity (transports/identity.h): the one membership rule every transport checks.
#include "transports/identity.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace nanoccl {
namespace {

TEST(CommIdentity, AProofVerifiesOnlyForTheSameSecretCommunicatorLabelAndContext) {
  const CommIdentity a("0123456789abcdef-secret", "comm-a");
  const crypto::Mac proof = a.prove("label", {"rank 1", "nonce"});
  EXPECT_TRUE(CommIdentity("0123456789abcdef-secret", "comm-a")
                  .verify("label", {"rank 1", "nonce"}, proof.data(), proof.size()));
  // Another secret, another communicator of the same job, another label or context: no.
  EXPECT_FALSE(CommIdentity("0123456789abcdef-other", "comm-a")
                   .verify("label", {"rank 1", "nonce"}, proof.data(), proof.size()));
  EXPECT_FALSE(CommIdentity("0123456789abcdef-secret", "comm-b")
                   .verify("label", {"rank 1", "nonce"}, proof.data(), proof.size()));
  EXPECT_FALSE(a.verify("other label", {"rank 1", "nonce"}, proof.data(), proof.size()));
  EXPECT_FALSE(a.verify("label", {"rank 1", "nonce2"}, proof.data(), proof.size()));
  // The context's parts are length-delimited: moving a byte between parts changes the proof.
  EXPECT_FALSE(a.verify("label", {"rank 1n", "once"}, proof.data(), proof.size()));
}

TEST(CommIdentity, TokensMayBeCutShortButNotEmptyOrLonger) {
  const CommIdentity a("0123456789abcdef-secret", "comm-a");
  const crypto::Mac proof = a.prove("token", {"x"});
  EXPECT_TRUE(a.verify("token", {"x"}, proof.data(), 16));
  crypto::Mac flipped = proof;
  flipped[15] ^= 1;
  EXPECT_FALSE(a.verify("token", {"x"}, flipped.data(), 16));
  EXPECT_FALSE(a.verify("token", {"x"}, proof.data(), 0));
  EXPECT_FALSE(a.verify("token", {"x"}, proof.data(), 8));  // too short to mean anything
  uint8_t longer[40] = {};
  std::memcpy(longer, proof.data(), proof.size());
  EXPECT_FALSE(a.verify("token", {"x"}, longer, sizeof(longer)));
}

TEST(CommIdentity, NoProofEqualsAKey) {
  const CommIdentity a("0123456789abcdef-secret", "comm-a");
  const crypto::Mac proof = a.prove("label", {"x"});
  const crypto::Key key = a.derive("label", {"x"});
  EXPECT_NE(std::memcmp(proof.data(), key.data(), key.size()), 0);
}

TEST(CommIdentity, KeysDifferPerPurposeAndCommunicator) {
  const CommIdentity a("0123456789abcdef-secret", "comm-a");
  const CommIdentity b("0123456789abcdef-secret", "comm-b");
  EXPECT_NE(a.derive("c->a", {"n"}), a.derive("a->c", {"n"}));
  EXPECT_NE(a.derive("c->a", {"n"}), b.derive("c->a", {"n"}));
  EXPECT_EQ(a.derive("c->a", {"n"}), CommIdentity("0123456789abcdef-secret", "comm-a")
                                         .derive("c->a", {"n"}));
  EXPECT_NE(a.commHash(), b.commHash());
  EXPECT_EQ(a.commHash(), hashCommId("comm-a"));
}

}  // namespace
}  // namespace nanoccl
