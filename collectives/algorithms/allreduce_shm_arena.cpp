#include "allreduce_shm_arena.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"

namespace dlop::coll {
namespace {

constexpr std::size_t kPage = 4096;
// All slots of a host together: small enough to stay in the last-level cache
// at two ranks (where the slots are reused round after round). Rounds of at
// most 512 KiB keep a rank's slots and the block it reduces in its own L2 and
// are still long enough that the three flag exchanges per round cost little
// (measured at two ranks: 1 MiB rounds were 5-10% slower from 512 KiB to
// 8 MiB, 256 KiB rounds no faster).
constexpr std::size_t kSlotBudget = 4u << 20;
constexpr std::size_t kMaxSlot = 512u << 10;
constexpr std::size_t kMinSlot = 64u << 10;

std::size_t flags_bytes(int n) {
  return (transport::shm_flags_bytes(3 * static_cast<std::size_t>(n)) + kPage - 1) / kPage * kPage;
}

}  // namespace

std::size_t HostArena::slot_bytes_for(int local_ranks) {
  const std::size_t share = kSlotBudget / (2 * static_cast<std::size_t>(std::max(local_ranks, 1)));
  return std::clamp(share / kPage * kPage, kMinSlot, kMaxSlot);
}

std::size_t HostArena::segment_bytes(int local_ranks, std::size_t slot_bytes) {
  return flags_bytes(local_ranks) + 2 * static_cast<std::size_t>(local_ranks) * (slot_bytes + sizeof(InlineBox));
}

HostArena::HostArena(transport::ShmSegment segment, int local_ranks, int me, std::size_t slot_bytes)
    : segment_(std::move(segment)), n_(local_ranks), me_(me), slot_bytes_(slot_bytes) {
  if (segment_.size() < segment_bytes(n_, slot_bytes_)) {
    throw_error(Errc::kInvalidArgument, fmt::format("shm arena '{}': {} B is too small for {} ranks of {} B slots",
                                                    segment_.name(), segment_.size(), n_, slot_bytes_));
  }
  flags_ = transport::shm_flags_at(segment_, 0, 3 * static_cast<std::size_t>(n_));
  slots_ = segment_.data() + flags_bytes(n_);
  // Zero-filled by the kernel: every box's seq starts at 0 (as the flags do).
  boxes_ = static_cast<InlineBox*>(static_cast<void*>(slots_ + 2 * static_cast<std::size_t>(n_) * slot_bytes_));
}

void attach_host_arena(Group& group, transport::Bootstrap& bootstrap, const std::string& name,
                       std::chrono::milliseconds timeout) {
  const std::vector<int>& local = group.local_ranks();
  if (local.size() < 2) return;
  std::vector<int> mesh_ranks;
  int me = -1;
  for (std::size_t i = 0; i < local.size(); ++i) {
    mesh_ranks.push_back(group.mesh_rank(local[i]));
    if (local[i] == group.rank()) me = static_cast<int>(i);
  }
  const int n = static_cast<int>(local.size());
  const std::size_t slot = HostArena::slot_bytes_for(n);
  auto segment =
      transport::ShmSegment::create_shared(bootstrap, mesh_ranks, name, HostArena::segment_bytes(n, slot), timeout);
  group.set_host_arena(std::make_shared<HostArena>(std::move(segment), n, me, slot));
}

}  // namespace dlop::coll
