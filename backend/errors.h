// The one way nanoccl's failures reach torch (docs/usage.md, "Errors"):
// - a call this rank refuses before anything is queued (CallError) is ValueError where an
//   argument's value is wrong (a root outside the group, sizes that do not fit, a setting) and
//   TypeError where its type is (a dtype nanoccl does not reduce, tensors of two dtypes), as
//   ProcessGroupNCCL raises them; a refused collective leaves a refused call in its place
//   (Communicator::refusedCall), so its peers, which made the call, meet a mismatch;
// - what a peer, the network, a timeout or a shut-down group causes is c10d's DistBackendError,
//   on every rank it reaches, naming both ranks where there are two (the core's Status says).
// A Status becomes an exception here and nowhere else: raise() on the calling thread, errorOf()
// for a Future.
#pragma once

#include <exception>
#include <string>

#include "common/status.h"

namespace nanoccl::pg {

enum class ErrorKind { kValue, kType, kBackend };

// An invalid argument is a ValueError; everything else is the backend's.
inline ErrorKind kindOf(const Status& st) {
  return st.code() == StatusCode::kInvalidArgument ? ErrorKind::kValue : ErrorKind::kBackend;
}

// A call refused on this rank before anything was queued; ProcessGroupNanoccl::run() raises it.
struct CallError {
  std::string message;
  ErrorKind kind = ErrorKind::kValue;
};

// Throws the c10 error of `kind` (ValueError, TypeError, DistBackendError) with `message`.
[[noreturn]] void raise(ErrorKind kind, const std::string& message);
// `context` then the status: its message alone for an invalid argument, with its code
// ("PeerError: ...") otherwise.
[[noreturn]] void raise(const Status& st, const std::string& context);
std::exception_ptr errorOf(const Status& st, const std::string& context);
std::exception_ptr errorOf(ErrorKind kind, const std::string& message);

}  // namespace nanoccl::pg
