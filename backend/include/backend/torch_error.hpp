// A dlop::Error on its way through torch: the torch exception torch's own
// backends throw for it (ValueError for a bad argument, DistBackendError for
// the rest), which still carries dlop's code so that dlop._C raises the
// matching dlop.errors class in Python (backend/python/error_bindings.cpp).
#pragma once

#include <c10/util/Exception.h>

#include <string>

#include "core/error.hpp"

namespace dlop::backend {

class ErrorCode {
 public:
  explicit ErrorCode(Errc code) : code_(code) {}
  virtual ~ErrorCode() = default;
  Errc code() const { return code_; }

 private:
  Errc code_;
};

template <class TorchError>
class CodedTorchError final : public TorchError, public ErrorCode {
 public:
  CodedTorchError(Errc code, std::string message, c10::SourceLocation where)
      : TorchError(where, std::move(message)), ErrorCode(code) {}
};

// The torch exception for a dlop error of this code.
std::exception_ptr torch_error(Errc code, std::string message,
                               c10::SourceLocation where = {__builtin_FUNCTION(), __builtin_FILE(),
                                                            static_cast<uint32_t>(__builtin_LINE())});

}  // namespace dlop::backend

// TORCH_CHECK_VALUE that raises dlop.InvalidArgumentError (a ValueError) in Python.
#define DLOP_CHECK_ARG(cond, ...)                                                                        \
  do {                                                                                                   \
    if (!(cond)) {                                                                                       \
      throw ::dlop::backend::CodedTorchError<::c10::ValueError>(                                         \
          ::dlop::Errc::kInvalidArgument, ::c10::str(__VA_ARGS__),                                       \
          ::c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)});                   \
    }                                                                                                    \
  } while (false)
