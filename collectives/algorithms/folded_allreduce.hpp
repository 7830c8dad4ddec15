// What the allreduce algorithms made for p = 2^k ranks share (recursive
// doubling, Rabenseifner; private to collectives/algorithms): their buffers,
// the vector cut into columns run by the lane pipeline (lane_pipeline.hpp),
// and the fold-in of any number of ranks onto p (PowerOfTwoFold in
// blocks.hpp) as the first and last steps of every column. A subclass
// describes only the rounds between, which the extra ranks sit out.
//
// Buffers: send[count] -> recv[count], send == recv in place; recv holds the
// partial result throughout. Step 0 starts each column from this rank's data
// (copied in when out of place); an extra rank hands it to its odd partner,
// which combines it on the left (the extra rank is the lower one). The last
// step hands the result back to the extra rank.
#pragma once

#include <algorithm>
#include <memory>
#include <string_view>

#include "blocks.hpp"
#include "collectives/reduce.hpp"
#include "collectives/registry.hpp"
#include "lane_pipeline.hpp"

namespace dlop::coll {

class FoldedAllreduceTask : public LanePipelineTask {
 protected:
  static constexpr std::size_t kWindow = 4;

  FoldedAllreduceTask(const CollArgs& args, const Group& group, transport::Tag base_tag, std::size_t column_bytes)
      : LanePipelineTask(group, base_tag),
        send_(args.send),
        recv_(args.recv),
        count_(args.count),
        dtype_(args.dtype),
        op_(args.op),
        esize_(dtype_size(args.dtype)),
        column_(chunk_elements(column_bytes, esize_)),
        fold_(group.size()),
        me_(group.rank()),
        vrank_(fold_.vrank(me_)) {}

  // Called once by the subclass's constructor: `rounds` steps between the
  // fold-in and the hand-back; scratch_bytes of scratch per lane.
  void configure_rounds(int rounds, std::size_t scratch_bytes) {
    rounds_ = rounds;
    configure(chunks_in(count_, column_), rounds + 2, kWindow, scratch_bytes);
  }

  // Round 1..rounds of the column `c`, whose partial result is at acc; only
  // on ranks with a virtual rank. `slot` is the lane's scratch.
  virtual StepIo plan_round(const Span& c, std::byte* acc, int round, std::byte* slot) = 0;
  virtual void finish_round(const Span& c, std::byte* acc, int round, const std::byte* slot) = 0;

  // dst = (lower rank's data) op (higher rank's data), whichever this rank is.
  void combine_in_order(std::byte* mine, const std::byte* theirs, bool mine_is_lower, std::size_t count) const {
    reduce_into(op_, dtype_, mine, mine_is_lower ? mine : theirs, mine_is_lower ? theirs : mine, count);
  }

  const void* send_;
  void* recv_;
  std::size_t count_;
  DataType dtype_;
  ReduceOp op_;
  std::size_t esize_;
  std::size_t column_;  // elements
  PowerOfTwoFold fold_;
  int me_;
  int vrank_;

 private:
  StepIo plan(std::size_t column, int step, std::size_t lane) final {
    const Span c = chunk_of(count_, column_, column);
    const std::size_t bytes = c.count * esize_;
    std::byte* acc = element_at(recv_, c.offset, esize_);
    if (step == 0) {
      move_bytes(acc, element_at(send_, c.offset, esize_), bytes);
      if (fold_.is_extra(me_)) return {.send_to = me_ + 1, .send_data = acc, .send_bytes = bytes};
      if (fold_.has_extra(me_)) return {.recv_from = me_ - 1, .recv_data = scratch(lane), .recv_bytes = bytes};
      return {};
    }
    if (step == rounds_ + 1) {
      if (fold_.has_extra(me_)) return {.send_to = me_ - 1, .send_data = acc, .send_bytes = bytes};
      if (fold_.is_extra(me_)) return {.recv_from = me_ + 1, .recv_data = acc, .recv_bytes = bytes};
      return {};
    }
    if (vrank_ < 0) return {};
    return plan_round(c, acc, step, scratch(lane));
  }

  void finish(std::size_t column, int step, std::size_t lane) final {
    if (vrank_ < 0 || step > rounds_) return;
    const Span c = chunk_of(count_, column_, column);
    std::byte* acc = element_at(recv_, c.offset, esize_);
    if (step > 0) {
      finish_round(c, acc, step, scratch(lane));
    } else if (fold_.has_extra(me_)) {
      combine_in_order(acc, scratch(lane), false, c.count);
    }
  }

  int rounds_ = 0;
};

// The descriptor of such an algorithm: it serves every case.
template <typename FoldedTask>
Algorithm folded_allreduce_algorithm(std::string_view name) {
  return {
      .kind = CollKind::kAllreduce,
      .name = name,
      .accepts = [](const CollArgs&, const Group&) { return true; },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        check_reduction(args.op, args.dtype);
        return std::make_unique<FoldedTask>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
