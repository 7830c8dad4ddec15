// All-reduce among the ranks of one host through the group's shared segment
// (allreduce_shm_arena.hpp), in rounds of at most one slot of bytes.
//
// Small rounds (one flag exchange): each rank copies its input into its slot,
// posts `arrived`, waits for everyone's, and reduces all slots in rank order
// into its output, so every rank computes the same bits the same way.
//
// Larger rounds (reduce-scatter + all-gather through the segment, about 3 S
// bytes of memory traffic per rank at two ranks): each rank copies into its
// slot only the blocks that others reduce; reduces its own block from its own
// input and the peers' slots, in rank order, into its own slot; posts
// `reduced`; then copies every other block out of its owner's slot (its own
// one it copied to the output while reducing it). Each block is
// reduced once, by its owner, so all ranks hold the same bits.
//
// Waiting never blocks: progress() returns false and the caller comes back.
// A peer that dies while awaited is found by the mesh's liveness check and
// named in a kPeerDead error.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "allreduce_shm_arena.hpp"
#include "blocks.hpp"
#include "collectives/reduce.hpp"
#include "collectives/registry.hpp"
#include "core/error.hpp"

namespace dlop::coll {
namespace {

// Up to this many bytes one flag exchange beats the two of reduce-scatter +
// all-gather, although every rank reads every slot.
constexpr std::size_t kSmallBytes = 16u << 10;
// Blocks start on cache lines: no line is written by two ranks' kernels.
constexpr std::size_t kLineBytes = 64;
// A piece of the own block that is reduced and copied out while in L1.
constexpr std::size_t kPieceBytes = 8u << 10;

class ShmAllreduce final : public Task {
 public:
  ShmAllreduce(const CollArgs& args, const Group& group, HostArena& arena)
      : group_(group), arena_(arena), send_(static_cast<const std::byte*>(args.send)),
        recv_(static_cast<std::byte*>(args.recv)), count_(args.count), dtype_(args.dtype), op_(args.op),
        size_(dtype_size(args.dtype)), n_(group.size()), me_(group.rank()),
        small_(args.count * size_ <= std::min(kSmallBytes, arena.slot_bytes())),
        round_elems_(small_ ? args.count : arena.slot_bytes() / size_),
        rounds_((count_ + round_elems_ - 1) / round_elems_), first_(arena.reserve(rounds_)) {}

  ~ShmAllreduce() override {
    if (round_ < rounds_) arena_.poison(fmt::format("shm all-reduce of sequence {} was abandoned", first_ + round_));
  }

  bool progress() override {
    if (round_ == rounds_) return true;
    if (!started_) {
      if (!arena_.poisoned().empty()) {
        throw_error(Errc::kCanceled, "shm all-reduce refused: an earlier one on this group failed: " + arena_.poisoned());
      }
      if (!arena_.turn_of(first_)) return false;  // an earlier shm operation still runs here
      started_ = true;
      set_round(0);
    }
    for (;;) {
      const std::uint64_t seq = first_ + round_;
      switch (step_) {
        case Step::kWaitFree:
          if (seq > 2 && !peers_at(&HostArena::done, seq - 2, "release of the slots of round")) return false;
          copy_in(seq);
          arena_.arrived(me_).post(seq);
          step_ = Step::kWaitArrived;
          [[fallthrough]];
        case Step::kWaitArrived:
          if (!peers_at(&HostArena::arrived, seq, "input of round")) return false;
          if (small_) {
            reduce_all(seq);
            arena_.done(me_).post(seq);
            if (next_round()) return true;
            continue;
          }
          reduce_own_block(seq);
          arena_.reduced(me_).post(seq);
          step_ = Step::kWaitReduced;
          [[fallthrough]];
        case Step::kWaitReduced:
          if (!peers_at(&HostArena::reduced, seq, "reduced block of round")) return false;
          copy_out(seq);
          arena_.done(me_).post(seq);
          if (next_round()) return true;
          continue;
      }
    }
  }

  bool polls_memory() const override { return true; }

  std::vector<int> waiting_for() const override {
    std::vector<int> late;
    if (!started_ || round_ == rounds_) return late;  // an earlier operation here, or nothing
    const std::uint64_t seq = first_ + round_;
    for (int r = 0; r < n_; ++r) {
      if (r == me_) continue;
      const bool behind = step_ == Step::kWaitFree      ? seq > 2 && arena_.done(r).load() < seq - 2
                          : step_ == Step::kWaitArrived ? arena_.arrived(r).load() < seq
                                                        : arena_.reduced(r).load() < seq;
      if (behind) late.push_back(r);
    }
    return late;
  }

 private:
  enum class Step { kWaitFree, kWaitArrived, kWaitReduced };
  using FlagOf = transport::ShmFlag& (HostArena::*)(int) const;

  void set_round(std::uint64_t round) {
    round_ = round;
    step_ = Step::kWaitFree;
    if (round_ == rounds_) return;
    round_offset_ = round_ * round_elems_;
    round_count_ = std::min(round_elems_, count_ - round_offset_);
  }
  // Finishes the round; true when it was the last.
  bool next_round() {
    set_round(round_ + 1);
    if (round_ < rounds_) return false;
    arena_.finish(first_ + rounds_ - 1);
    return true;
  }

  // Element offset of block q of this round: blocks of whole cache lines.
  std::size_t block_start(int q) const {
    const std::size_t unit = kLineBytes / size_;
    const std::size_t units = (round_count_ + unit - 1) / unit;
    return std::min(round_count_, even_block_offset(units, static_cast<std::size_t>(n_), static_cast<std::size_t>(q)) * unit);
  }
  const std::byte* input() const { return send_ + round_offset_ * size_; }
  std::byte* output() const { return recv_ + round_offset_ * size_; }

  // Whether every peer's flag is at least seq; remembers where it stopped.
  bool peers_at(FlagOf flag, std::uint64_t seq, const char* what) {
    for (; waiting_ < n_; ++waiting_) {
      if (waiting_ == me_ || (arena_.*flag)(waiting_).load() >= seq) continue;
      watch_.stalled(group_, waiting_, seq, "shm all-reduce", what);
      return false;
    }
    waiting_ = 0;
    return true;
  }

  void copy_in(std::uint64_t seq) {
    std::byte* slot = arena_.slot(seq, me_);
    if (small_) {
      std::memcpy(slot, input(), round_count_ * size_);
      return;
    }
    for (int q = 0; q < n_; ++q) {
      if (q == me_) continue;
      const std::size_t at = block_start(q) * size_;
      std::memcpy(slot + at, input() + at, block_start(q + 1) * size_ - at);
    }
  }

  void reduce_all(std::uint64_t seq) {
    std::byte* out = output();
    reduce_into(op_, dtype_, out, arena_.slot(seq, 0), arena_.slot(seq, 1), round_count_);
    for (int r = 2; r < n_; ++r) reduce_inplace(op_, dtype_, out, arena_.slot(seq, r), round_count_);
    finalize(op_, dtype_, out, round_count_, n_);
  }

  // Reduces in pieces that stay in L1, each copied to the output while hot,
  // so copy_out() need not read this block back (at two ranks that saves a
  // sixth of the memory traffic).
  void reduce_own_block(std::uint64_t seq) {
    const std::size_t begin = block_start(me_), end = block_start(me_ + 1);
    const std::size_t piece = std::max<std::size_t>(kPieceBytes / size_, 1);
    for (std::size_t i = begin; i < end; i += piece) {
      const std::size_t count = std::min(piece, end - i), at = i * size_;
      const auto source = [&](int r) -> const std::byte* { return (r == me_ ? input() : arena_.slot(seq, r)) + at; };
      std::byte* out = arena_.slot(seq, me_) + at;
      reduce_into(op_, dtype_, out, source(0), source(1), count);
      for (int r = 2; r < n_; ++r) reduce_inplace(op_, dtype_, out, source(r), count);
      finalize(op_, dtype_, out, count, n_);
      std::memcpy(output() + at, out, count * size_);
    }
  }

  void copy_out(std::uint64_t seq) {
    for (int q = 0; q < n_; ++q) {
      if (q == me_) continue;  // reduce_own_block() wrote it
      const std::size_t at = block_start(q) * size_;
      std::memcpy(output() + at, arena_.slot(seq, q) + at, block_start(q + 1) * size_ - at);
    }
  }

  const Group& group_;
  HostArena& arena_;
  const std::byte* send_;
  std::byte* recv_;
  std::size_t count_;
  DataType dtype_;
  ReduceOp op_;
  std::size_t size_;
  int n_;
  int me_;
  bool small_;
  std::size_t round_elems_;
  std::uint64_t rounds_;
  std::uint64_t first_;
  bool started_ = false;
  std::uint64_t round_ = 0;
  Step step_ = Step::kWaitFree;
  std::size_t round_offset_ = 0;
  std::size_t round_count_ = 0;
  int waiting_ = 0;
  StallWatch watch_;
};

}  // namespace

void register_shm_allreduce(std::vector<Algorithm>& out) {
  out.push_back({CollKind::kAllreduce, "shm",
                 [](const CollArgs&, const Group& group) {
                   const HostArena* arena = group.host_arena();
                   return group.size() >= 2 && group.hosts() == 1 && arena != nullptr && arena->size() == group.size();
                 },
                 [](const CollArgs& args, const Group& group, transport::Tag) -> std::unique_ptr<Task> {
                   check_reduction(args.op, args.dtype);  // before any sequence number is taken
                   if (args.count == 0) return std::make_unique<EmptyArenaTask>();
                   return std::make_unique<ShmAllreduce>(args, group, *group.host_arena());
                 }});
}

}  // namespace dlop::coll
