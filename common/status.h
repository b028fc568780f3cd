// Status and Result: the one error style below torch_ext/ (docs/design.md, convention 4).
//
// Every fallible function in common/, transports/ and collectives/ returns a Status or a
// Result<T>; callers propagate with NANOCCL_CHECK / NANOCCL_ASSIGN_OR_RETURN. Exceptions never
// cross these layers. backend/ turns a failed Status into one c10::Error (TORCH_CHECK).
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace nanoccl {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input from the caller on this rank
  kMismatch,         // ranks disagree about a collective (op, dtype, count, root, order)
  kTimeout,          // a deadline passed
  kPeerError,        // a peer died, closed its connection or reported an error
  kProtocolError,    // bytes on the wire that do not follow the protocol
  kAborted,          // the communicator was aborted locally
  kUnavailable,      // a feature or resource is not available here (io_uring, an interface)
  kInternal,         // a bug or a system call that should not fail
};

const char* statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool isOk() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Mismatch: rank 0 called allreduce(...) but rank 1 called ..."
  std::string toString() const;

  // Returns a copy whose message is prefixed with `context` (e.g. "allreduce #7: ").
  Status withContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status mismatchError(std::string m) { return {StatusCode::kMismatch, std::move(m)}; }
inline Status timeoutError(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
inline Status peerError(std::string m) { return {StatusCode::kPeerError, std::move(m)}; }
inline Status protocolError(std::string m) { return {StatusCode::kProtocolError, std::move(m)}; }
inline Status abortedError(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status unavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status internalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
// An internal error carrying strerror(err) and the failed call's name.
Status systemError(const char* what, int err);

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design

  bool isOk() const { return status_.isOk(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace nanoccl

#define NANOCCL_CONCAT_INNER(a, b) a##b
#define NANOCCL_CONCAT(a, b) NANOCCL_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` failed.
#define NANOCCL_CHECK(expr)                              \
  do {                                                   \
    ::nanoccl::Status nanoccl_status_ = (expr);          \
    if (!nanoccl_status_.isOk()) return nanoccl_status_; \
  } while (0)

// `lhs = value of expr`, or return its Status.
#define NANOCCL_ASSIGN_OR_RETURN(lhs, expr) \
  NANOCCL_ASSIGN_OR_RETURN_IMPL(NANOCCL_CONCAT(nanoccl_result_, __LINE__), lhs, expr)
#define NANOCCL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.isOk()) return tmp.status();               \
  lhs = std::move(tmp).value()
