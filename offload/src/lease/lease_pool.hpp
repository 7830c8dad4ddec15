// The LeaseManager's pool of batch buffers: one slot per buffer, each free or
// in use (leased to a daemon, filled, or held by the consumer). The lease
// state machine (lease_manager.cpp) says when a slot changes hands; the pool
// owns the memory and keeps memory a dropped daemon may still write away from
// the next lease.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "offload/lease_manager.hpp"

namespace dlop::offload {

class LeasePool {
 public:
  // `count` slots of `bytes` each, from `allocator` (empty: page_locked_memory);
  // bytes 0: the slots start empty and grow() to what they are asked to hold.
  // An allocation that fails throws and leaves the pool as it was.
  void allocate(std::size_t count, std::size_t bytes, PoolAllocator allocator);

  // The first free slot, if any.
  std::optional<std::size_t> free_slot() const;
  bool in_use(std::size_t slot) const { return slot < free_.size() && !free_[slot]; }
  void take(std::size_t slot) { free_[slot] = false; }
  void give_back(std::size_t slot) { free_[slot] = true; }

  std::byte* data(std::size_t slot) const { return slots_[slot].data; }
  // A slot's buffer holding at least `bytes`, once a batch's size is known
  // (the slot is taken, so nothing else uses its old buffer).
  std::byte* grow(std::size_t slot, std::size_t bytes);
  // Frees a slot whose memory a dropped daemon may still write: that memory is
  // set aside until the pool goes, and the slot gets memory of its own.
  void retire(std::size_t slot);

 private:
  struct Slot {
    std::shared_ptr<std::byte> memory;
    std::byte* data = nullptr;
    std::size_t capacity = 0;
  };
  Slot make(std::size_t bytes) const;

  PoolAllocator allocator_;
  std::size_t slot_bytes_ = 0;
  std::vector<Slot> slots_;
  std::vector<bool> free_;
  std::vector<Slot> retired_;
};

}  // namespace dlop::offload
