// The shared segment of one group's ranks on a host, as the shm all-reduce
// uses it (private to collectives/algorithms).
//
// Layout (the user area of one transport::ShmSegment):
//   arrived[n], reduced[n], done[n]   one ShmFlag per local rank each
//   slot[parity][rank]                n slots per parity, slot_bytes each
//   inline_box[parity][rank]          n InlineBoxes per parity (allreduce_inline.cpp)
// Every shm operation runs as one or more rounds; each round takes the next
// sequence number s (1, 2, ...) of this group on this host and uses the slots
// of parity s % 2. A rank posts its flags with s: arrived (its input is in its
// slot), reduced (its block of the result is in its slot), done (it has read
// everything it needs of round s). Before writing its slot for round s a rank
// waits until every peer is done with round s - 2, the last one on that
// parity: a fast rank never overwrites what a slow peer still reads.
// Inline rounds (allreduce_inline.cpp) share the sequence numbers and post
// `done` too, but carry their input in an InlineBox instead of a slot.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "collectives/group.hpp"
#include "collectives/inline_allreduce.hpp"
#include "collectives/stall_watch.hpp"
#include "collectives/task.hpp"
#include "transport/shm_flag.hpp"
#include "transport/shm_segment.hpp"

namespace dlop::coll {

// A small input together with the sequence number of the round it belongs
// to: a reader that sees `seq` finds the payload in the same cache line (up to
// 56 B) or the lines right after it.
struct alignas(64) InlineBox {
  static constexpr std::size_t kMaxBytes = kInlineAllreduceMaxBytes;
  std::atomic<std::uint64_t> seq{0};  // posted with release after the payload
  std::byte payload[kMaxBytes];
};

class HostArena {
 public:
  // Bytes of one slot for n local ranks: 2n slots stay within a fixed budget.
  static std::size_t slot_bytes_for(int local_ranks);
  static std::size_t segment_bytes(int local_ranks, std::size_t slot_bytes);

  // me: this rank's index among the local ranks.
  HostArena(transport::ShmSegment segment, int local_ranks, int me, std::size_t slot_bytes);

  int size() const { return n_; }
  int me() const { return me_; }
  std::size_t slot_bytes() const { return slot_bytes_; }
  std::byte* slot(std::uint64_t seq, int rank) const {
    return slots_ + ((seq & 1) * static_cast<std::size_t>(n_) + static_cast<std::size_t>(rank)) * slot_bytes_;
  }
  InlineBox& inline_box(std::uint64_t seq, int rank) const {
    return boxes_[(seq & 1) * static_cast<std::size_t>(n_) + static_cast<std::size_t>(rank)];
  }
  transport::ShmFlag& arrived(int rank) const { return flags_[static_cast<std::size_t>(rank)]; }
  transport::ShmFlag& reduced(int rank) const { return flags_[static_cast<std::size_t>(n_ + rank)]; }
  transport::ShmFlag& done(int rank) const { return flags_[static_cast<std::size_t>(2 * n_ + rank)]; }

  // This rank's operations on the arena run one after another, in the order
  // they were created (the same on every rank): each reserves its rounds at
  // creation and may start once every earlier one has finished here.
  std::uint64_t reserve(std::uint64_t rounds) {
    const std::uint64_t first = next_seq_;
    next_seq_ += rounds;
    return first;
  }
  bool turn_of(std::uint64_t first_seq) const { return finished_seq_ + 1 == first_seq; }
  void finish(std::uint64_t last_seq) { finished_seq_ = last_seq; }
  // An operation abandoned half-way leaves the flags out of step: later ones
  // fail at once instead of waiting for rounds that never come.
  void poison(std::string why) {
    if (poisoned_.empty()) poisoned_ = std::move(why);
  }
  const std::string& poisoned() const { return poisoned_; }

 private:
  transport::ShmSegment segment_;
  int n_;
  int me_;
  std::size_t slot_bytes_;
  std::span<transport::ShmFlag> flags_;
  std::byte* slots_;
  InlineBox* boxes_;
  std::uint64_t next_seq_ = 1;
  std::uint64_t finished_seq_ = 0;
  std::string poisoned_;
};

// An arena all-reduce of count 0: nothing to exchange, and no sequence number
// taken (on any rank), so the arena's rounds stay in step.
class EmptyArenaTask final : public Task {
 public:
  bool progress() override { return true; }
};

}  // namespace dlop::coll
