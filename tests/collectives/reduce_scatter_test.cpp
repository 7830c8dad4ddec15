// Reduce-scatter and reduce-scatter-v "ring" between real processes: ranks x
// counts, the full dtype x op matrix at small counts and a few pairs at
// 1Mi+3 elements per block, out of place and both in-place forms (send ==
// recv: the result at the start of the buffer; recv == this rank's block of
// send), checked against an exact reference.
#include <gtest/gtest.h>

#include "reduction_check.hpp"

namespace dlop::coll {
namespace {

using namespace ref;

template <typename NextTag>
void reduce_scatter_case(const Group& g, NextTag& next_tag, CollKind kind, DataType dtype, ReduceOp op,
                         std::size_t count, Placement place) {
  const int n = g.size();
  const auto me = static_cast<std::size_t>(g.rank());
  const std::vector<std::size_t> counts = block_counts(kind == CollKind::kReduceScatterv, n, count);
  std::vector<std::size_t> offset(counts.size(), 0);
  for (std::size_t b = 1; b < counts.size(); ++b) offset[b] = offset[b - 1] + counts[b - 1];
  const std::size_t total = offset.back() + counts.back();
  const std::size_t esize = dtype_size(dtype);
  const std::uint64_t seed = mix(static_cast<std::uint64_t>(dtype) * 31 + static_cast<std::uint64_t>(op) + count);

  auto input = make_input(dtype, op, g.rank(), total, seed);
  std::vector<std::byte> apart(place == Placement::kApart ? counts[me] * esize + kGuardBytes : 0, std::byte{kGuard});
  CollArgs args;
  args.kind = kind;
  args.dtype = dtype;
  args.op = op;
  args.count = count;
  if (kind == CollKind::kReduceScatterv) args.counts = counts;
  args.send = input.data();
  args.recv = place == Placement::kApart        ? apart.data()
              : place == Placement::kSameBuffer ? input.data()
                                                : input.data() + offset[me] * esize;
  run(g, args, "ring", next_tag());

  const std::string what = std::string(kind_name(kind)) + " " + placement_name(place);
  check_reduced(dtype, op, n, args.recv, offset[me], counts[me], seed, what);
  if (place == Placement::kApart) {
    EXPECT_TRUE(guard_intact(apart, counts[me] * esize)) << what << ": wrote past the end";
    EXPECT_EQ(input, make_input(dtype, op, g.rank(), total, seed)) << what << ": input modified";
  } else {
    EXPECT_TRUE(guard_intact(input, total * esize)) << what << ": wrote past the end";
  }
}

std::string case_name(CollKind kind, int ranks, std::size_t count) {
  return std::string(kind_name(kind)) + "_ranks" + std::to_string(ranks) + "_count" + std::to_string(count);
}

constexpr CollKind kKinds[] = {CollKind::kReduceScatter, CollKind::kReduceScatterv};

class ReduceScatterSmall : public ::testing::TestWithParam<std::tuple<CollKind, int, std::size_t>> {};

TEST_P(ReduceScatterSmall, EveryDtypeAndOpEveryPlacement) {
  const auto [kind, ranks, count] = GetParam();
  on_ranks(ranks, [&](const Group& g, auto next_tag, transport::Bootstrap&) {
    for_each_supported_pair([&](DataType dtype, ReduceOp op) {
      reduce_scatter_case(g, next_tag, kind, dtype, op, count, Placement::kApart);
    });
    for (const Placement place : {Placement::kSameBuffer, Placement::kOwnBlock}) {
      reduce_scatter_case(g, next_tag, kind, DataType::kFloat32, ReduceOp::kSum, count, place);
      reduce_scatter_case(g, next_tag, kind, DataType::kBFloat16, ReduceOp::kAvg, count, place);
      reduce_scatter_case(g, next_tag, kind, DataType::kInt32, ReduceOp::kBxor, count, place);
      reduce_scatter_case(g, next_tag, kind, DataType::kUInt8, ReduceOp::kMin, count, place);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, ReduceScatterSmall,
                         ::testing::Combine(::testing::ValuesIn(kKinds), ::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::Values(0u, 1u, 7u, 1023u)),
                         [](const auto& param_info) {
                           return case_name(std::get<0>(param_info.param), std::get<1>(param_info.param),
                                            std::get<2>(param_info.param));
                         });

class ReduceScatterLarge : public ::testing::TestWithParam<std::tuple<CollKind, int>> {};

TEST_P(ReduceScatterLarge, RepresentativePairs) {
  const auto [kind, ranks] = GetParam();
  on_ranks(ranks, [&](const Group& g, auto next_tag, transport::Bootstrap&) {
    reduce_scatter_case(g, next_tag, kind, DataType::kFloat32, ReduceOp::kSum, kLargeCount, Placement::kApart);
    reduce_scatter_case(g, next_tag, kind, DataType::kInt64, ReduceOp::kBxor, kLargeCount, Placement::kOwnBlock);
    reduce_scatter_case(g, next_tag, kind, DataType::kBFloat16, ReduceOp::kAvg, kLargeCount, Placement::kSameBuffer);
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, ReduceScatterLarge,
                         ::testing::Combine(::testing::ValuesIn(kKinds), ::testing::Values(1, 2, 3, 4, 5)),
                         [](const auto& param_info) {
                           return case_name(std::get<0>(param_info.param), std::get<1>(param_info.param), kLargeCount);
                         });

}  // namespace
}  // namespace dlop::coll
