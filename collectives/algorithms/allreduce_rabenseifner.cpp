// Allreduce "rabenseifner": a reduce-scatter by recursive halving, then an
// all-gather by recursive doubling. Each rank sends and receives about
// 2 (p - 1) / p of the vector in 2 log2(p) rounds: for medium sizes.
//
// Halving round i (mask m = p >> (i + 1)): the ranks whose virtual ranks
// differ in bit m split their current range of blocks; each keeps the half
// its bit selects, sends the other and combines what it receives into the
// kept half (lower virtual rank's data on the left). After the last round
// virtual rank v holds block v reduced; AVG divides it once; the doubling
// rounds then swap ranges of growing size until every rank has all blocks.
// Each block is reduced by exactly one rank, so all ranks hold the same bits.
//
// Any number of ranks, by the fold-in of blocks.hpp (the extra ranks hand
// their vector in first and get the result back last). Vectors are cut into
// slices of kSliceBytes, each run as a column (lane_pipeline.hpp) and split
// into p blocks; scratch is one slice (half of one for powers of two) per lane.
// Buffers: send[count] -> recv[count], send == recv in place.
#include <algorithm>
#include <memory>

#include "blocks.hpp"
#include "collectives/reduce.hpp"
#include "collectives/registry.hpp"
#include "lane_pipeline.hpp"

namespace dlop::coll {
namespace {

constexpr std::size_t kSliceBytes = 1u << 20;
constexpr std::size_t kWindow = 4;

class AllreduceRabenseifner final : public LanePipelineTask {
 public:
  AllreduceRabenseifner(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : LanePipelineTask(group, base_tag),
        send_(args.send),
        recv_(args.recv),
        count_(args.count),
        dtype_(args.dtype),
        op_(args.op),
        esize_(dtype_size(args.dtype)),
        slice_(chunk_elements(kSliceBytes, esize_)),
        fold_(group.size()),
        me_(group.rank()),
        vrank_(fold_.vrank(me_)) {
    const std::size_t columns = chunks_in(count_, slice_);
    // The largest receive: a whole slice from the extra rank, else the first
    // halving round's half (the first slice is the largest).
    const std::size_t largest = std::min(slice_, count_);
    const int half = fold_.p() / 2;
    std::size_t elements = 0;
    if (fold_.has_extra(me_)) {
      elements = largest;
    } else if (vrank_ >= 0 && half > 0) {
      elements = std::max(range(largest, 0, half).count, range(largest, half, half).count);
    }
    configure(columns, 2 * fold_.levels() + 2, kWindow, elements * esize_);
  }

 private:
  // Step 0: fold-in; 1..L: halving (mask p >> step); L+1..2L: doubling
  // (mask 1 << (step - L - 1)); 2L+1: the result back to the extra ranks.
  StepIo plan(std::size_t column, int step, std::size_t lane) override {
    const Span s = chunk_of(count_, slice_, column);
    const std::size_t bytes = s.count * esize_;
    std::byte* acc = element_at(recv_, s.offset, esize_);
    const int levels = fold_.levels();
    if (step == 0) {
      move_bytes(acc, element_at(send_, s.offset, esize_), bytes);  // out of place: start from our data
      if (fold_.is_extra(me_)) return {.send_to = me_ + 1, .send_data = acc, .send_bytes = bytes};
      if (fold_.has_extra(me_)) return {.recv_from = me_ - 1, .recv_data = slot(lane), .recv_bytes = bytes};
      return {};
    }
    if (step == 2 * levels + 1) {
      if (fold_.has_extra(me_)) return {.send_to = me_ - 1, .send_data = acc, .send_bytes = bytes};
      if (fold_.is_extra(me_)) return {.recv_from = me_ + 1, .recv_data = acc, .recv_bytes = bytes};
      return {};
    }
    if (vrank_ < 0) return {};
    if (step <= levels) {
      const int m = fold_.p() >> step;
      const int keep = vrank_ & ~(m - 1);
      const Span give = range(s.count, keep ^ m, m);
      const int partner = fold_.rank_of(vrank_ ^ m);
      return {partner, acc + give.offset * esize_, give.count * esize_,
              partner, slot(lane), range(s.count, keep, m).count * esize_};
    }
    const int m = 1 << (step - levels - 1);
    const int mine = vrank_ & ~(m - 1);
    const Span have = range(s.count, mine, m);
    const Span get = range(s.count, mine ^ m, m);
    const int partner = fold_.rank_of(vrank_ ^ m);
    return {partner, acc + have.offset * esize_, have.count * esize_,
            partner, acc + get.offset * esize_, get.count * esize_};
  }

  void finish(std::size_t column, int step, std::size_t lane) override {
    if (vrank_ < 0) return;
    const Span s = chunk_of(count_, slice_, column);
    std::byte* acc = element_at(recv_, s.offset, esize_);
    const int levels = fold_.levels();
    if (step == 0 && fold_.has_extra(me_)) {
      reduce_into(op_, dtype_, acc, slot(lane), acc, s.count);  // the extra rank's data on the left
    } else if (step >= 1 && step <= levels) {
      const int m = fold_.p() >> step;
      const Span keep = range(s.count, vrank_ & ~(m - 1), m);
      std::byte* kept = acc + keep.offset * esize_;
      const bool lower = (vrank_ & m) == 0;
      reduce_into(op_, dtype_, kept, lower ? kept : slot(lane), lower ? slot(lane) : kept, keep.count);
    }
    if (step == levels) {
      const Span own = range(s.count, vrank_, 1);
      finalize(op_, dtype_, acc + own.offset * esize_, own.count, group().size());
    }
  }

  // Blocks [first, first + blocks) of a slice of `elements` cut into p blocks.
  Span range(std::size_t elements, int first, int blocks) const {
    const auto p = static_cast<std::size_t>(fold_.p());
    const std::size_t begin = even_block_offset(elements, p, static_cast<std::size_t>(first));
    return {begin, even_block_offset(elements, p, static_cast<std::size_t>(first + blocks)) - begin};
  }
  std::byte* slot(std::size_t lane) const { return scratch(lane); }

  const void* send_;
  void* recv_;
  std::size_t count_;
  DataType dtype_;
  ReduceOp op_;
  std::size_t esize_;
  std::size_t slice_;  // elements
  PowerOfTwoFold fold_;
  int me_;
  int vrank_;
};

}  // namespace

Algorithm allreduce_rabenseifner() {
  return {
      .kind = CollKind::kAllreduce,
      .name = "rabenseifner",
      .accepts = [](const CollArgs&, const Group&) { return true; },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        check_reduction(args.op, args.dtype);
        return std::make_unique<AllreduceRabenseifner>(args, group, base_tag);
      },
  };
}

}  // namespace dlop::coll
