// Errors carried across dlop's layers: one exception type with a code, so the
// upper layers can tell a dead peer from a timeout without parsing text.
#pragma once

#include <fmt/format.h>

#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dlop {

enum class Errc {
  kInvalidArgument,
  kTimeout,
  kPeerDead,
  kCanceled,
  kTransport,
  kProtocol,
  kSystem,
};

std::string_view errc_name(Errc code);

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  Errc code() const { return code_; }

 private:
  Errc code_;
};

// Throws dlop::Error with a message prefixed by the code and the throwing site.
[[noreturn]] void throw_error(Errc code, std::string message,
                              std::source_location where = std::source_location::current());

// Throws kSystem with strerror(errno) appended.
[[noreturn]] void throw_errno(std::string message,
                              std::source_location where = std::source_location::current());

}  // namespace dlop
