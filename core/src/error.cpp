#include "core/error.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace dlop {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::kInvalidArgument: return "invalid argument";
    case Errc::kTimeout: return "timeout";
    case Errc::kPeerDead: return "peer dead";
    case Errc::kCanceled: return "canceled";
    case Errc::kTransport: return "transport error";
    case Errc::kProtocol: return "protocol error";
    case Errc::kSystem: return "system error";
  }
  return "unknown error";
}

void throw_error(Errc code, std::string message, std::source_location where) {
  const auto file = std::filesystem::path(where.file_name()).filename().string();
  throw Error(code, fmt::format("dlop {}: {} [{}:{}]", errc_name(code), message, file, where.line()));
}

void throw_errno(std::string message, std::source_location where) {
  const int err = errno;
  throw_error(Errc::kSystem, fmt::format("{}: {}", message, std::strerror(err)), where);
}

}  // namespace dlop
