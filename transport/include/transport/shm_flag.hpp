// Flags in shared memory: one writer posts increasing sequence numbers, any
// number of readers wait for a value. Each flag owns a cache line so that
// posting one never invalidates a neighbour's line.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/wait_policy.hpp"
#include "transport/shm_segment.hpp"

namespace dlop::transport {

// Processes map the segment at different addresses: the atomic must not rely
// on a lock table or on its own address.
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shm flags need address-free atomics");

struct alignas(64) ShmFlag {
  std::atomic<std::uint64_t> value{0};

  // Publishes seq; writes made before it are visible to whoever sees seq.
  void post(std::uint64_t seq) { value.store(seq, std::memory_order_release); }
  std::uint64_t load() const { return value.load(std::memory_order_acquire); }

  // Waits until the flag is at least seq and returns the value seen. Polls
  // as the process's wait policy says (spin, or yield the core), then sleeps
  // with a growing pause (up to 1 ms), and calls check() (if set) every few
  // ms so the caller can throw when a peer died. Throws kTimeout past
  // deadline, naming `what`.
  std::uint64_t wait_at_least(std::uint64_t seq, std::chrono::steady_clock::time_point deadline,
                              const std::function<void()>& check, std::string_view what = "shm flag") const {
    using Clock = std::chrono::steady_clock;
    constexpr auto kCheckEvery = std::chrono::milliseconds(2);
    Waiter waiter;
    auto next_check = Clock::now() + kCheckEvery;
    for (unsigned round = 1;; ++round) {
      const std::uint64_t seen = load();
      if (seen >= seq) return seen;
      const bool polling = waiter.pause();
      if (polling && (round & 63u) != 0) continue;  // the clock only every few polls
      const auto now = Clock::now();
      if (now >= next_check) {
        if (check) check();
        next_check = now + kCheckEvery;
      }
      if (now >= deadline) {
        throw_error(Errc::kTimeout, fmt::format("{}: waited for sequence {} but it is still at {}", what, seq, seen));
      }
      if (!polling) waiter.sleep_a_little();
    }
  }
};
static_assert(sizeof(ShmFlag) == 64);

// Bytes needed for `count` flags.
constexpr std::size_t shm_flags_bytes(std::size_t count) { return count * sizeof(ShmFlag); }

// A view of `count` flags at `offset` (a multiple of 64) in the segment's user
// area. The area is zero-filled at creation, so the flags start at 0; no one
// needs to construct them. Throws kInvalidArgument when they do not fit.
inline std::span<ShmFlag> shm_flags_at(const ShmSegment& segment, std::size_t offset, std::size_t count) {
  if (offset % alignof(ShmFlag) != 0 || offset > segment.size() ||
      count > (segment.size() - offset) / sizeof(ShmFlag)) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("shm segment '{}': {} flags at offset {} do not fit in {} bytes, or the offset is not "
                            "a multiple of {}",
                            segment.name(), count, offset, segment.size(), alignof(ShmFlag)));
  }
  // The bytes were zero-initialised by the kernel; an all-zero lock-free atomic is
  // a valid object representation, so the flags are used in place.
  return {static_cast<ShmFlag*>(static_cast<void*>(segment.data() + offset)), count};
}

}  // namespace dlop::transport
