// Private parts of Mesh shared by its source files.
#pragma once

#include "transport/mesh.hpp"

namespace dlop::transport {

inline constexpr int kRankShift = kUserTagBits;
inline constexpr ucp_tag_t kUserTagMask = (ucp_tag_t{1} << kUserTagBits) - 1;

}  // namespace dlop::transport
