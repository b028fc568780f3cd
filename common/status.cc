#include "common/status.h"

#include <cstring>

namespace nanoccl {

const char* statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kMismatch: return "Mismatch";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kPeerError: return "PeerError";
    case StatusCode::kProtocolError: return "ProtocolError";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::toString() const {
  if (isOk()) return "OK";
  return std::string(statusCodeName(code_)) + ": " + message_;
}

Status Status::withContext(const std::string& context) const {
  if (isOk()) return *this;
  return Status(code_, context + message_);
}

Status systemError(const char* what, int err) {
  return internalError(std::string(what) + " failed: " + std::strerror(err));
}

}  // namespace nanoccl
