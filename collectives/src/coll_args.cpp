#include "collectives/coll_args.hpp"

#include <array>
#include <fmt/format.h>
#include <numeric>

#include "core/error.hpp"

namespace dlop::coll {
namespace {

constexpr std::array<std::string_view, 12> kKinds = {
    "allreduce", "broadcast", "reduce", "allgather", "allgatherv", "gather", "scatter",
    "reducescatter", "reducescatterv", "alltoall", "alltoallv", "barrier",
};

}  // namespace

std::string_view kind_name(CollKind kind) { return kKinds.at(static_cast<std::size_t>(kind)); }

CollKind parse_kind(std::string_view name) {
  for (std::size_t i = 0; i < kKinds.size(); ++i) {
    if (kKinds[i] == name) return static_cast<CollKind>(i);
  }
  throw_error(Errc::kInvalidArgument, fmt::format("unknown collective '{}'", name));
}

std::size_t CollArgs::bytes() const {
  std::size_t elements = count;
  if (kind == CollKind::kAllgatherv || kind == CollKind::kReduceScatterv || kind == CollKind::kAlltoallv) {
    elements = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  }
  return elements * element_size();
}

}  // namespace dlop::coll
