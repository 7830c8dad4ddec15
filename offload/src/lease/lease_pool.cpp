#include "lease_pool.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dlop::offload {
namespace {

constexpr std::size_t kAlign = 4096;
// Labels and lengths are int64s at offsets the layout aligns to 8.
constexpr std::size_t kMinAlign = 64;

std::size_t round_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

std::shared_ptr<std::byte> page_locked_memory(std::size_t bytes) {
  bytes = round_up(bytes);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlign, bytes));
  if (p == nullptr) return nullptr;
  // Page-locked where RLIMIT_MEMLOCK allows; plain memory works too.
  const bool locked = ::mlock(p, bytes) == 0;
  if (!locked) log().debug("offload: mlock of a {} byte batch buffer failed", bytes);
  return std::shared_ptr<std::byte>(p, [bytes, locked](std::byte* q) {
    if (locked) ::munlock(q, bytes);
    std::free(q);
  });
}

LeasePool::Slot LeasePool::make(std::size_t bytes) const {
  bytes = round_up(bytes);
  auto memory = allocator_ ? allocator_(bytes) : page_locked_memory(bytes);
  if (!memory) {
    throw_error(Errc::kSystem, "LeaseManager: cannot allocate a " + std::to_string(bytes) + " byte batch buffer");
  }
  if (reinterpret_cast<std::uintptr_t>(memory.get()) % kMinAlign != 0) {
    throw_error(Errc::kInvalidArgument, "LeaseManager: the pool allocator returned memory aligned to less than " +
                                            std::to_string(kMinAlign) + " bytes");
  }
  return Slot{memory, memory.get(), bytes};
}

void LeasePool::allocate(std::size_t count, std::size_t bytes, PoolAllocator allocator) {
  std::swap(allocator_, allocator);
  std::vector<Slot> pool(count);
  try {
    if (bytes != 0) {
      for (Slot& s : pool) s = make(bytes);
    }
  } catch (...) {
    std::swap(allocator_, allocator);
    throw;
  }
  slot_bytes_ = bytes;
  slots_ = std::move(pool);
  free_.assign(slots_.size(), true);
}

std::optional<std::size_t> LeasePool::free_slot() const {
  for (std::size_t i = 0; i < free_.size(); ++i) {
    if (free_[i]) return i;
  }
  return std::nullopt;
}

std::byte* LeasePool::grow(std::size_t slot, std::size_t bytes) {
  Slot& s = slots_[slot];
  if (s.capacity < bytes) {
    s = Slot{};  // before the new one: the pool holds at most one buffer per slot
    s = make(bytes);
  }
  return s.data;
}

void LeasePool::retire(std::size_t slot) {
  retired_.push_back(slots_[slot]);
  slots_[slot] = Slot{};
  if (slot_bytes_ != 0) slots_[slot] = make(slot_bytes_);
  free_[slot] = true;
}

}  // namespace dlop::offload
