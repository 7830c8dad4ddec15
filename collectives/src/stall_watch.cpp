#include "collectives/stall_watch.hpp"

#include <fmt/format.h>

#include <ctime>

#include "core/error.hpp"

namespace dlop::coll {

namespace {
// Milliseconds of a clock that is cheap to read (the watchdog needs no more).
std::int64_t coarse_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}
}  // namespace

void StallWatch::stalled(const Group& group, int peer, std::uint64_t seq, std::string_view algorithm,
                         std::string_view what) {
  transport::Mesh& mesh = group.mesh();
  if ((++polls_ & 63u) == 0) {
    const std::int64_t now = coarse_ms();
    if (now >= next_check_ms_) {
      if (next_check_ms_ != 0) mesh.check_peers();
      next_check_ms_ = now + mesh.options().watchdog.count();
    }
  }
  if (const auto& failure = mesh.peer_failure(group.mesh_rank(peer))) {
    throw_error(Errc::kPeerDead, fmt::format("{}: {} died before its {} {} ({})", algorithm,
                                             mesh.describe(group.mesh_rank(peer)), what, seq, *failure));
  }
}

}  // namespace dlop::coll
