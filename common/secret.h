// Where a job's secret comes from, and the key its ranks prove themselves with.
//
// Two modes:
// - out of band: NANOCCL_SECRET_FILE (a regular file owned by the job's user and readable by
//   no one else; refused with the reason otherwise) or NANOCCL_SECRET. Nothing secret goes
//   into the c10d store, so whoever can read the store (it is unauthenticated) still cannot
//   join the job.
// - from the store (the default, as before): rank 0 draws 32 random bytes and puts them in the
//   store. This keeps out other jobs and mistakes, not someone who can reach the store.
// In both modes the secret itself never crosses a connection: the key derived from it keys the
// handshake's challenge-response MACs (transports/tcp/wire.h) and the shm segments' proofs.
#pragma once

#include <string>

#include "common/config.h"
#include "common/crypto.h"
#include "common/status.h"

namespace nanoccl {

// Shortest out-of-band secret accepted (after trailing whitespace is removed): a guessable
// secret would let anyone who recorded one handshake test guesses offline.
constexpr size_t kMinSecretBytes = 16;
constexpr size_t kMaxSecretFileBytes = 4096;

struct JobSecret {
  bool outOfBand = false;
  std::string where;  // "NANOCCL_SECRET_FILE=<path>", "NANOCCL_SECRET" or "the store"
  std::string bytes;  // the secret (trailing whitespace removed); keys come from jobKey()
};

// The out-of-band secret the configuration names, with `outOfBand` false (and no bytes) when
// it names none. kInvalidArgument, with the reason, for a file that is missing, not a regular
// file, not the user's, readable or writable by group or others, empty or too short, and for
// both settings at once.
Result<JobSecret> loadOutOfBandSecret(const Config& config);

// The key for secret bytes from either source (an HMAC of them under a fixed label, so the
// raw secret is used for nothing else). Transports derive it from TransportOptions::secret.
crypto::Key jobKey(const std::string& secretBytes);

}  // namespace nanoccl
