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
// Any number of ranks, by the fold-in (folded_allreduce.hpp, which also says
// what the buffers hold). Vectors are cut into slices of kSliceBytes, each run
// as a column and split into p blocks; scratch is one slice (half of one for
// powers of two) per lane.
#include <algorithm>

#include "folded_allreduce.hpp"

namespace dlop::coll {
namespace {

constexpr std::size_t kSliceBytes = 1u << 20;

class AllreduceRabenseifner final : public FoldedAllreduceTask {
 public:
  AllreduceRabenseifner(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : FoldedAllreduceTask(args, group, base_tag, kSliceBytes) {
    // The largest receive: a whole slice from the extra rank, else the first
    // halving round's half (the first slice is the largest).
    const std::size_t largest = std::min(column_, count_);
    const int half = fold_.p() / 2;
    std::size_t elements = 0;
    if (fold_.has_extra(me_)) {
      elements = largest;
    } else if (vrank_ >= 0 && half > 0) {
      elements = std::max(range(largest, 0, half).count, range(largest, half, half).count);
    }
    configure_rounds(2 * fold_.levels(), elements * esize_);
  }

 private:
  // Rounds 1..L: halving (mask p >> round); L+1..2L: doubling (mask 1 << (round - L - 1)).
  StepIo plan_round(const Span& s, std::byte* acc, int round, std::byte* slot) override {
    const int levels = fold_.levels();
    if (round <= levels) {
      const int m = fold_.p() >> round;
      const int keep = vrank_ & ~(m - 1);
      const Span give = range(s.count, keep ^ m, m);
      const int partner = fold_.rank_of(vrank_ ^ m);
      return {partner, acc + give.offset * esize_, give.count * esize_,
              partner, slot, range(s.count, keep, m).count * esize_};
    }
    const int m = 1 << (round - levels - 1);
    const int mine = vrank_ & ~(m - 1);
    const Span have = range(s.count, mine, m);
    const Span get = range(s.count, mine ^ m, m);
    const int partner = fold_.rank_of(vrank_ ^ m);
    return {partner, acc + have.offset * esize_, have.count * esize_,
            partner, acc + get.offset * esize_, get.count * esize_};
  }

  void finish_round(const Span& s, std::byte* acc, int round, const std::byte* slot) override {
    const int levels = fold_.levels();
    if (round > levels) return;
    const int m = fold_.p() >> round;
    const Span keep = range(s.count, vrank_ & ~(m - 1), m);
    combine_in_order(acc + keep.offset * esize_, slot, (vrank_ & m) == 0, keep.count);
    if (round == levels) {
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
};

}  // namespace

Algorithm allreduce_rabenseifner() { return folded_allreduce_algorithm<AllreduceRabenseifner>("rabenseifner"); }

}  // namespace dlop::coll
