// All-reduce of up to kInlineAllreduceMaxBytes among the ranks of one host, in
// a single exchange of cache lines: each rank copies its input into its own
// InlineBox of the group's arena and posts the round's sequence number in the
// same box (release, after the payload); every rank waits until every box
// holds the round's number (acquire) and reduces all boxes in rank order into
// its output. Up to 56 B the number and the payload share one cache line, so
// a peer's contribution costs one cache miss; larger payloads follow in the
// next lines. All ranks compute the same bits the same way.
//
// The boxes alternate by parity like the shm slots, and no `done` wait is
// needed before writing one: this rank starts round s only after finishing
// s - 1, which needed every peer's round s - 1 posted, and a peer posts s - 1
// only after reading everything of s - 2, the last round of the same parity.
// Rounds share the arena's sequence with the shm algorithm; `done` is posted
// for the shm rounds that may follow.
#include "collectives/inline_allreduce.hpp"

#include <fmt/format.h>

#include <cstring>

#include "allreduce_shm_arena.hpp"
#include "collectives/reduce.hpp"
#include "collectives/registry.hpp"
#include "core/error.hpp"

namespace dlop::coll {
namespace {

constexpr std::string_view kName = "inline all-reduce";

class InlineAllreduceTask final : public Task {
 public:
  explicit InlineAllreduceTask(InlineAllreduceRound round) : round_(std::move(round)) {}
  bool progress() override { return round_.progress(); }
  bool polls_memory() const override { return true; }
  std::vector<int> waiting_for() const override { return round_.waiting_for(); }

 private:
  InlineAllreduceRound round_;
};

}  // namespace

bool InlineAllreduceRound::accepts(const CollArgs& args, const Group& group) {
  const HostArena* arena = group.host_arena();
  return args.kind == CollKind::kAllreduce && args.bytes() <= kInlineAllreduceMaxBytes &&
         group.size() >= 2 && group.hosts() == 1 && arena != nullptr && arena->size() == group.size();
}

InlineAllreduceRound::InlineAllreduceRound(const CollArgs& args, const Group& group)
    : group_(&group), arena_(group.host_arena()), send_(args.send), recv_(args.recv), count_(args.count),
      dtype_(args.dtype), op_(args.op), n_(group.size()), me_(group.rank()), seq_(arena_->reserve(1)) {}

InlineAllreduceRound::InlineAllreduceRound(InlineAllreduceRound&& other) noexcept
    : group_(other.group_), arena_(other.arena_), send_(other.send_), recv_(other.recv_), count_(other.count_),
      dtype_(other.dtype_), op_(other.op_), n_(other.n_), me_(other.me_), seq_(other.seq_), posted_(other.posted_),
      finished_(other.finished_), waiting_(other.waiting_), watch_(other.watch_) {
  other.finished_ = true;
}

InlineAllreduceRound::~InlineAllreduceRound() {
  if (!finished_) arena_->poison(fmt::format("{} of sequence {} was abandoned", kName, seq_));
}

const std::byte* InlineAllreduceRound::box(int rank) const { return arena_->inline_box(seq_, rank).payload; }

bool InlineAllreduceRound::progress() {
  if (finished_) return true;
  if (!posted_) {
    if (!arena_->poisoned().empty()) {
      throw_error(Errc::kCanceled, fmt::format("{} refused: an earlier one on this group failed: {}", kName,
                                               arena_->poisoned()));
    }
    if (!arena_->turn_of(seq_)) return false;  // an earlier shm operation still runs here
    InlineBox& mine = arena_->inline_box(seq_, me_);
    std::memcpy(mine.payload, send_, count_ * dtype_size(dtype_));
    mine.seq.store(seq_, std::memory_order_release);
    posted_ = true;
  }
  for (; waiting_ < n_; ++waiting_) {
    if (arena_->inline_box(seq_, waiting_).seq.load(std::memory_order_acquire) >= seq_) continue;
    watch_.stalled(*group_, waiting_, seq_, kName, "input of round");
    return false;
  }
  reduce_into(op_, dtype_, recv_, box(0), box(1), count_);
  for (int r = 2; r < n_; ++r) reduce_inplace(op_, dtype_, recv_, box(r), count_);
  finalize(op_, dtype_, recv_, count_, n_);
  arena_->done(me_).post(seq_);
  arena_->finish(seq_);
  finished_ = true;
  return true;
}

std::vector<int> InlineAllreduceRound::waiting_for() const {
  std::vector<int> late;
  if (!posted_ || finished_) return late;  // an earlier operation here, or nothing
  for (int r = 0; r < n_; ++r) {
    if (arena_->inline_box(seq_, r).seq.load(std::memory_order_acquire) < seq_) late.push_back(r);
  }
  return late;
}

std::unique_ptr<Task> as_task(InlineAllreduceRound round) {
  return std::make_unique<InlineAllreduceTask>(std::move(round));
}

void register_inline_allreduce(std::vector<Algorithm>& out) {
  out.push_back({CollKind::kAllreduce, kInlineAllreduceName,
                 [](const CollArgs& args, const Group& group) { return InlineAllreduceRound::accepts(args, group); },
                 [](const CollArgs& args, const Group& group, transport::Tag) -> std::unique_ptr<Task> {
                   check_reduction(args.op, args.dtype);  // before any sequence number is taken
                   if (args.bytes() > kInlineAllreduceMaxBytes) {
                     throw_error(Errc::kInvalidArgument, fmt::format("{}: {} B do not fit in a box of {} B", kName,
                                                                     args.bytes(), kInlineAllreduceMaxBytes));
                   }
                   if (args.count == 0) return std::make_unique<EmptyArenaTask>();
                   return as_task(InlineAllreduceRound(args, group));
                 }});
}

}  // namespace dlop::coll
