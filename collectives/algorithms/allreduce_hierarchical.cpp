// Allreduce "hierarchical", for groups spread over several hosts with more
// than one rank on some host: the ranks of each host reduce onto their
// leader (the host's lowest group rank), the leaders all-reduce among
// themselves across hosts, and each leader broadcasts the result to its host.
// Only one rank per host talks across hosts, and cross-host traffic is one
// vector per host instead of one per rank.
//
// The three phases are tasks of existing algorithms, each picked from the
// tuning table for its own sub-group and size (select_algorithm): today a
// binomial reduce and broadcast inside the host, and recursive doubling,
// Rabenseifner or the ring between leaders; better intra-host algorithms
// registered later are used without a change here. DLOP_ALGO does not reach
// the phases: it forces what the whole group runs, not its parts.
//
// Large vectors are cut into segments of kSegmentBytes that flow through the
// phases like a pipeline: while the leaders exchange segment k, the host
// already reduces segment k + 1 and broadcasts segment k - 1, so intra-host
// memory traffic and the network overlap. Each phase runs one segment at a
// time, in segment order, on its own quarter of the operation's step tags;
// so on every pair of ranks and every tag, messages are posted in the same
// order on both sides (a sub-task finishes, here and at its peers, before the
// next segment's task of that phase posts anything), and the phases never
// share a tag. The last quarter holds the scheduler's signature tag.
//
// AVG runs the phases as SUM and the leader divides once, by the size of the
// whole group, before its broadcast: a mean of host means would weigh the
// ranks of small hosts more. Every rank receives the leader's bits, so all
// hold bitwise the same result.
//
// Buffers: send[count] -> recv[count], send == recv in place. A leader
// accumulates into recv; another rank only reads send until the broadcast of
// the same segment overwrites recv (in place, after its reduce has finished
// reading that segment). No scratch of its own beyond the phases' tasks.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "blocks.hpp"
#include "collectives/reduce.hpp"
#include "collectives/registry.hpp"

namespace dlop::coll {
namespace {

constexpr std::size_t kSegmentBytes = 4u << 20;
constexpr transport::Tag kPhaseTags = (kMaxStep + 1) / 4;

enum class Phase : std::uint8_t { kReduce, kInterHost, kBroadcast };

class AllreduceHierarchical final : public Task {
 public:
  AllreduceHierarchical(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : send_(args.send),
        recv_(args.recv),
        count_(args.count),
        dtype_(args.dtype),
        op_(args.op),
        phase_op_(args.op == ReduceOp::kAvg ? ReduceOp::kSum : args.op),
        nranks_(group.size()),
        esize_(dtype_size(args.dtype)),
        segment_(chunk_elements(kSegmentBytes, esize_)),
        segments_(chunks_in(count_, segment_)),
        base_tag_(base_tag) {
    std::vector<int> local;
    for (const int g : group.local_ranks()) local.push_back(group.mesh_rank(g));
    local_.emplace(group.mesh(), std::move(local));
    sub_to_group_[kLocal] = group.local_ranks();
    const bool leader = group.local_ranks().front() == group.rank();
    stages_.push_back({Phase::kReduce});
    if (leader) {
      // Hosts are numbered by first appearance, so the first rank met of each
      // host is its lowest: the leaders, in host order.
      std::vector<int> leaders;
      std::vector<bool> seen(static_cast<std::size_t>(group.hosts()), false);
      for (int g = 0; g < group.size(); ++g) {
        const auto host = static_cast<std::size_t>(group.host_of(g));
        if (!seen[host]) {
          leaders.push_back(group.mesh_rank(g));
          sub_to_group_[kLeaders].push_back(g);
        }
        seen[host] = true;
      }
      leaders_.emplace(group.mesh(), std::move(leaders));
      stages_.push_back({Phase::kInterHost});
    }
    stages_.push_back({Phase::kBroadcast});
  }

  bool progress() override {
    for (bool moved = true; moved;) {
      moved = false;
      for (std::size_t i = 0; i < stages_.size(); ++i) moved = advance(i) || moved;
    }
    return stages_.back().completed == segments_;
  }

  // What the running phases wait for, as ranks of the whole group.
  std::vector<int> waiting_for() const override {
    std::vector<int> ranks;
    for (const Stage& stage : stages_) {
      if (!stage.task) continue;
      const auto& to_group = sub_to_group_[stage.phase == Phase::kInterHost ? kLeaders : kLocal];
      for (const int r : stage.task->waiting_for()) ranks.push_back(to_group.at(static_cast<std::size_t>(r)));
    }
    return ranks;
  }

 private:
  struct Stage {
    Phase phase;
    std::size_t completed = 0;  // segments through this phase, in order
    std::unique_ptr<Task> task;  // the segment `completed`, while it runs
  };

  // Runs stage i as far as it can; true when anything changed.
  bool advance(std::size_t i) {
    Stage& stage = stages_[i];
    bool moved = false;
    while (stage.completed < segments_) {
      if (!stage.task) {
        // A segment enters a phase once it has left the previous one here.
        if (i > 0 && stages_[i - 1].completed <= stage.completed) return moved;
        stage.task = start(stage.phase, stage.completed);
        moved = true;
      }
      if (!stage.task->progress()) return moved;
      stage.task.reset();
      if (stage.phase == Phase::kInterHost) {
        const Span s = chunk_of(count_, segment_, stage.completed);
        finalize(op_, dtype_, element_at(recv_, s.offset, esize_), s.count, nranks_);
      }
      ++stage.completed;
      moved = true;
    }
    return moved;
  }

  std::unique_ptr<Task> start(Phase phase, std::size_t segment) const {
    const Span s = chunk_of(count_, segment_, segment);
    CollArgs args;
    args.count = s.count;
    args.dtype = dtype_;
    args.op = phase_op_;
    args.root = 0;  // the leader is the lowest rank of its host
    args.recv = element_at(recv_, s.offset, esize_);
    const Group* group = &*local_;
    switch (phase) {
      case Phase::kReduce:
        args.kind = CollKind::kReduce;
        args.send = element_at(send_, s.offset, esize_);
        break;
      case Phase::kInterHost:
        args.kind = CollKind::kAllreduce;
        args.send = args.recv;
        group = &*leaders_;
        break;
      case Phase::kBroadcast:
        args.kind = CollKind::kBroadcast;
        args.send = args.recv;
        break;
    }
    static const AlgorithmOverrides kTableOnly;
    const transport::Tag tag = base_tag_ + static_cast<transport::Tag>(phase) * kPhaseTags;
    return select_algorithm(args, *group, kTableOnly).create(args, *group, tag);
  }

  const void* send_;
  void* recv_;
  std::size_t count_;
  DataType dtype_;
  ReduceOp op_;
  ReduceOp phase_op_;  // AVG runs as SUM, divided once at the leader
  int nranks_;
  std::size_t esize_;
  std::size_t segment_;  // elements
  std::size_t segments_;
  transport::Tag base_tag_;
  // The sub-groups outlive the phases' tasks, which refer to them.
  std::optional<Group> local_;    // this host's ranks, the leader first
  std::optional<Group> leaders_;  // one rank per host; on leaders only
  std::vector<Stage> stages_;     // this rank's phases, in order
  // Group rank of each rank of local_ and of leaders_.
  static constexpr std::size_t kLocal = 0, kLeaders = 1;
  std::array<std::vector<int>, 2> sub_to_group_;
};

}  // namespace

Algorithm allreduce_hierarchical() {
  return {
      .kind = CollKind::kAllreduce,
      .name = "hierarchical",
      // Several hosts, and fewer hosts than ranks: some host has a rank to
      // fold in before crossing hosts. One rank per host gains nothing.
      .accepts = [](const CollArgs&, const Group& group) { return group.hosts() > 1 && group.hosts() < group.size(); },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        check_reduction(args.op, args.dtype);
        return std::make_unique<AllreduceHierarchical>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
