// Allreduce "recursive_doubling": log2(p) rounds; in round i every rank
// exchanges its whole partial result with the rank whose virtual rank
// differs in bit i and combines the two. Latency-optimal for small vectors.
//
// Any number of ranks: a group that is not a power of two is folded onto
// the largest power of two p (PowerOfTwoFold in blocks.hpp): each extra rank
// first hands its vector to its odd neighbour and gets the result back last.
// Every combination puts the lower virtual rank's data on the left, so all
// ranks compute bitwise the same result (min/max of -0.0 and +0.0 included);
// AVG divides once, after the last round.
//
// Buffers: send[count] -> recv[count], send == recv in place; recv holds the
// partial result. Vectors are cut into chunks of kChunkBytes run as columns
// (lane_pipeline.hpp), so scratch stays at kWindow chunks.
#include <algorithm>
#include <memory>

#include "blocks.hpp"
#include "collectives/reduce.hpp"
#include "collectives/registry.hpp"
#include "lane_pipeline.hpp"

namespace dlop::coll {
namespace {

constexpr std::size_t kChunkBytes = 256u << 10;
constexpr std::size_t kWindow = 4;

class AllreduceRecursiveDoubling final : public LanePipelineTask {
 public:
  AllreduceRecursiveDoubling(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : LanePipelineTask(group, base_tag),
        send_(args.send),
        recv_(args.recv),
        count_(args.count),
        dtype_(args.dtype),
        op_(args.op),
        esize_(dtype_size(args.dtype)),
        chunk_(chunk_elements(kChunkBytes, esize_)),
        fold_(group.size()),
        me_(group.rank()),
        vrank_(fold_.vrank(me_)) {
    const std::size_t columns = chunks_in(count_, chunk_);
    const bool receives = vrank_ >= 0 && (fold_.levels() > 0 || fold_.has_extra(me_));
    configure(columns, fold_.levels() + 2, kWindow, receives ? std::min(chunk_, count_) * esize_ : 0);
  }

 private:
  // Step 0 folds the extra ranks in, steps 1..levels are the rounds, the last
  // step hands the result back to the extra ranks.
  StepIo plan(std::size_t column, int step, std::size_t lane) override {
    const Span c = chunk_of(count_, chunk_, column);
    const std::size_t bytes = c.count * esize_;
    std::byte* acc = element_at(recv_, c.offset, esize_);
    if (step == 0) {
      move_bytes(acc, element_at(send_, c.offset, esize_), bytes);  // out of place: start from our data
      if (fold_.is_extra(me_)) return {.send_to = me_ + 1, .send_data = acc, .send_bytes = bytes};
      if (fold_.has_extra(me_)) return {.recv_from = me_ - 1, .recv_data = slot(lane), .recv_bytes = bytes};
      return {};
    }
    if (step == fold_.levels() + 1) {
      if (fold_.has_extra(me_)) return {.send_to = me_ - 1, .send_data = acc, .send_bytes = bytes};
      if (fold_.is_extra(me_)) return {.recv_from = me_ + 1, .recv_data = acc, .recv_bytes = bytes};
      return {};
    }
    if (vrank_ < 0) return {};
    const int partner = fold_.rank_of(vrank_ ^ (1 << (step - 1)));
    return {partner, acc, bytes, partner, slot(lane), bytes};
  }

  void finish(std::size_t column, int step, std::size_t lane) override {
    if (vrank_ < 0) return;
    const Span c = chunk_of(count_, chunk_, column);
    std::byte* acc = element_at(recv_, c.offset, esize_);
    if (step == 0 && fold_.has_extra(me_)) {
      reduce_into(op_, dtype_, acc, slot(lane), acc, c.count);  // the extra rank's data on the left
    } else if (step >= 1 && step <= fold_.levels()) {
      const bool lower = vrank_ < (vrank_ ^ (1 << (step - 1)));
      reduce_into(op_, dtype_, acc, lower ? acc : slot(lane), lower ? slot(lane) : acc, c.count);
    }
    if (step == fold_.levels()) finalize(op_, dtype_, acc, c.count, group().size());
  }

  std::byte* slot(std::size_t lane) const { return scratch(lane); }

  const void* send_;
  void* recv_;
  std::size_t count_;
  DataType dtype_;
  ReduceOp op_;
  std::size_t esize_;
  std::size_t chunk_;  // elements
  PowerOfTwoFold fold_;
  int me_;
  int vrank_;
};

}  // namespace

Algorithm allreduce_recursive_doubling() {
  return {
      .kind = CollKind::kAllreduce,
      .name = "recursive_doubling",
      .accepts = [](const CollArgs&, const Group&) { return true; },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        check_reduction(args.op, args.dtype);
        return std::make_unique<AllreduceRecursiveDoubling>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
