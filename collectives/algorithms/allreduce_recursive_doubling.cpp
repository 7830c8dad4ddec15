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
// Buffers and the fold-in: folded_allreduce.hpp. Vectors are cut into chunks
// of kChunkBytes run as columns, so scratch stays at kWindow chunks.
#include <algorithm>

#include "folded_allreduce.hpp"

namespace dlop::coll {
namespace {

constexpr std::size_t kChunkBytes = 256u << 10;

class AllreduceRecursiveDoubling final : public FoldedAllreduceTask {
 public:
  AllreduceRecursiveDoubling(const CollArgs& args, const Group& group, transport::Tag base_tag)
      : FoldedAllreduceTask(args, group, base_tag, kChunkBytes) {
    const bool receives = vrank_ >= 0 && (fold_.levels() > 0 || fold_.has_extra(me_));
    configure_rounds(fold_.levels(), receives ? std::min(column_, count_) * esize_ : 0);
  }

 private:
  // Round i: the whole partial result both ways with the partner across bit i - 1.
  StepIo plan_round(const Span& c, std::byte* acc, int round, std::byte* slot) override {
    const int partner = fold_.rank_of(vrank_ ^ (1 << (round - 1)));
    const std::size_t bytes = c.count * esize_;
    return {partner, acc, bytes, partner, slot, bytes};
  }

  void finish_round(const Span& c, std::byte* acc, int round, const std::byte* slot) override {
    combine_in_order(acc, slot, (vrank_ & (1 << (round - 1))) == 0, c.count);
    if (round == fold_.levels()) finalize(op_, dtype_, acc, c.count, group().size());
  }
};

}  // namespace

Algorithm allreduce_recursive_doubling() { return folded_allreduce_algorithm<AllreduceRecursiveDoubling>("recursive_doubling"); }

}  // namespace dlop::coll
