#include "backend/errors.h"

#include <c10/util/Exception.h>

namespace nanoccl::pg {

[[noreturn]] void raise(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kValue: C10_THROW_ERROR(ValueError, message);
    case ErrorKind::kType: C10_THROW_ERROR(TypeError, message);
    case ErrorKind::kBackend: break;
  }
  C10_THROW_ERROR(DistBackendError, message);
}

[[noreturn]] void raise(const Status& st, const std::string& context) {
  const ErrorKind kind = kindOf(st);
  raise(kind, context + (kind == ErrorKind::kValue ? st.message() : st.toString()));
}

std::exception_ptr errorOf(const Status& st, const std::string& context) {
  try {
    raise(st, context);
  } catch (...) {
    return std::current_exception();
  }
}

std::exception_ptr errorOf(ErrorKind kind, const std::string& message) {
  try {
    raise(kind, message);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace nanoccl::pg
