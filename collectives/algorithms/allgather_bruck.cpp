// Allgather "bruck": ceil(log2 n) rounds for any n, for small blocks.
//
// Rank r gathers the blocks of r, r + 1, ..., r + n - 1 (mod n) at the start
// of recv: its own block first; in round i (d = 2^i) it sends the first
// min(d, n - d) blocks it has to r - d and receives as many from r + d, placed
// after the d it has. A final rotation by r blocks puts block b at b * count.
// No scratch: the rotation is done in place.
//
// Buffers: send[count] -> recv[count * n]. In place (MPI_IN_PLACE): send ==
// recv, or send == this rank's block of recv, means that block is already
// there. Accepts every case.
#include <algorithm>
#include <memory>

#include "blocks.hpp"
#include "collectives/registry.hpp"
#include "lane_pipeline.hpp"

namespace dlop::coll {
namespace {

class AllgatherBruck final : public LanePipelineTask {
 public:
  AllgatherBruck(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : LanePipelineTask(group, base_tag),
        send_(args.send),
        recv_(static_cast<std::byte*>(args.recv)),
        block_(args.count * args.element_size()),
        n_(group.size()),
        me_(group.rank()) {
    int rounds = 0;
    while ((1 << rounds) < n_) ++rounds;
    configure(block_ > 0 ? 1 : 0, rounds, 1);
  }

 private:
  std::size_t at(int blocks) const { return static_cast<std::size_t>(blocks) * block_; }

  void begin() override {
    const void* own = send_ == recv_ ? recv_ + at(me_) : send_;
    move_bytes(recv_, own, block_);
  }

  StepIo plan(std::size_t /*column*/, int step, std::size_t /*lane*/) override {
    const int d = 1 << step;
    const std::size_t bytes = at(std::min(d, n_ - d));
    return {ring_index(me_ - d, n_), recv_, bytes, ring_index(me_ + d, n_), recv_ + at(d), bytes};
  }

  void end() override {
    if (block_ > 0 && me_ > 0) std::rotate(recv_, recv_ + at(n_ - me_), recv_ + at(n_));
  }

  const void* send_;
  std::byte* recv_;
  std::size_t block_;  // bytes
  int n_;
  int me_;
};

}  // namespace

Algorithm allgather_bruck() {
  return {
      .kind = CollKind::kAllgather,
      .name = "bruck",
      .accepts = [](const CollArgs&, const Group&) { return true; },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        return std::make_unique<AllgatherBruck>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
