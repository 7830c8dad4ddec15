// The inline all-reduce (algorithms/allreduce_inline.cpp) as a value its
// caller drives. The scheduler's fast path for a small blocking all-reduce
// runs one on the calling thread and allocates nothing; only when peers are
// late does it hand the round to the engine as a Task.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "collectives/coll_args.hpp"
#include "collectives/group.hpp"
#include "collectives/stall_watch.hpp"
#include "collectives/task.hpp"

namespace dlop::coll {

// The largest all-reduce carried in the host arena's boxes.
inline constexpr std::size_t kInlineAllreduceMaxBytes = 4096;
// The algorithm's name, as DLOP_ALGO and the registry spell it.
inline constexpr std::string_view kInlineAllreduceName = "inline";

class InlineAllreduceRound {
 public:
  // Whether a round can serve this all-reduce: at most
  // kInlineAllreduceMaxBytes, 2 ranks or more, all on this host and all
  // attached to its arena.
  static bool accepts(const CollArgs& args, const Group& group);

  // Takes the arena's next round: rounds are made in the same order on every
  // rank, like every arena operation, and an all-reduce of 0 elements takes
  // none (it has nothing to exchange). Requires accepts(args, group).
  InlineAllreduceRound(const CollArgs& args, const Group& group);
  // The moved-from round is left finished: only the new one may poison.
  InlineAllreduceRound(InlineAllreduceRound&& other) noexcept;
  InlineAllreduceRound& operator=(InlineAllreduceRound&&) = delete;
  // A round dropped before it finished poisons the arena (its peers' flags
  // are out of step with this rank's).
  ~InlineAllreduceRound();

  // Task::progress: true once the output holds the result.
  bool progress();
  // Task::waiting_for: group ranks whose input has not arrived.
  std::vector<int> waiting_for() const;

 private:
  const std::byte* box(int rank) const;

  const Group* group_;
  HostArena* arena_;
  const void* send_;
  void* recv_;
  std::size_t count_;
  DataType dtype_;
  ReduceOp op_;
  int n_;
  int me_;
  std::uint64_t seq_;
  bool posted_ = false;
  bool finished_ = false;
  int waiting_ = 0;
  StallWatch watch_;
};

// The round as a Task the engine progresses.
std::unique_ptr<Task> as_task(InlineAllreduceRound round);

}  // namespace dlop::coll
