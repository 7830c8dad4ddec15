// Private parts of Mesh shared by its source files.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/mesh.hpp"

namespace dlop::transport {

struct Mesh::AmContext {
  Mesh* mesh = nullptr;
  std::uint16_t id = 0;
  AmHandler handler;
};

inline constexpr int kRankShift = kUserTagBits;
inline constexpr ucp_tag_t kUserTagMask = (ucp_tag_t{1} << kUserTagBits) - 1;

}  // namespace dlop::transport
