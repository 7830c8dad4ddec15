// The collective benchmarks' buffers: one arena, allocated and touched once,
// carved into slots of [send | recv]. Rows small enough to sit in the cache
// rotate through enough slots to cover 64 MiB, one slot per call (OSU and
// xhc warn that reusing one buffer measures the cache); larger rows use one.
#pragma once

#include <cstddef>

#include "coll_case.hpp"

namespace dlop::bench {

inline constexpr std::size_t kRotateSpan = std::size_t{64} << 20;

class Arena {
 public:
  // Zero-filled: repeated in-place sums and products stay finite.
  explicit Arena(std::size_t bytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  std::byte* at(std::size_t offset) const { return data_ + offset; }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::byte* data_ = nullptr;
};

// How one row's buffers sit in the arena. In place uses only the recv part,
// which is large enough for the input too.
struct SlotPlan {
  std::size_t send_bytes = 0;
  std::size_t slot_bytes = 0;
  std::size_t slots = 1;
  std::size_t arena_bytes() const { return slots * slot_bytes; }
};

// Rotates (several slots) when layout.bytes <= rotate_bytes.
SlotPlan plan_slots(const CollLayout& layout, coll::DataType dtype, std::size_t rotate_bytes);

// The call of slot `slot` (modulo the slots), with the in-place conventions of
// coll_case.hpp; op and root are the template's.
Call slot_call(const Arena& arena, const SlotPlan& plan, std::size_t slot, const CollLayout& layout, Call call,
               int rank);

}  // namespace dlop::bench
