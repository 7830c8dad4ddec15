// The inline all-reduce ("inline": inputs of up to 4 KiB carried next to the
// sequence number in the host arena's boxes) between real processes: every
// dtype/op pair in and out of place at counts around the one-line and the
// 4 KiB limits against the exact reference; bitwise-identical floats on every
// rank; thousands of operations interleaved with shm ones (both share the
// arena's sequence and parities); several in flight at once; a rank killed
// while its peers wait on its box; and when the algorithm declines.
#include <gtest/gtest.h>


#include "common/expect_error.hpp"
#include "core/error.hpp"
#include "reduction_check.hpp"

namespace dlop::coll {
namespace {

using namespace ref;

constexpr std::size_t kMaxBytes = 4096;

// Counts of `dtype` worth testing: none, one, odd, the last that fits beside
// the sequence number in one cache line (56 B) and the first that does not,
// an odd count spanning several lines, and the largest accepted.
std::vector<std::size_t> counts_for(DataType dtype) {
  const std::size_t size = dtype_size(dtype);
  return {0, 1, 7, 56 / size, 56 / size + 1, 1001 / size | 1, kMaxBytes / size};
}

class InlineGrid : public ::testing::TestWithParam<int> {};

TEST_P(InlineGrid, EveryDtypeAndOpInAndOutOfPlace) {
  with_arena(GetParam(), [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    for_each_supported_pair([&](DataType dtype, ReduceOp op) {
      for (const std::size_t count : counts_for(dtype)) {
        for (const bool in_place : {false, true}) checked_allreduce(g, 0, "inline", dtype, op, count, in_place);
      }
    });
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, InlineGrid, ::testing::Values(2, 3, 4, 5), ranks_name);

TEST(InlineAllreduce, DeclinesAboveFourKiBOneRankAndAcrossHosts) {
  with_arena(2, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    const Algorithm& inline_algo = test::find_algorithm(CollKind::kAllreduce, "inline");
    EXPECT_TRUE(inline_algo.accepts(make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, kMaxBytes / 4), g));
    const CollArgs too_big = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, kMaxBytes / 4 + 1);
    EXPECT_FALSE(inline_algo.accepts(too_big, g));
    EXPECT_EQ(select_algorithm(too_big, g, AlgorithmOverrides::parse("allreduce:inline")).name, "shm");
    dlop::test::expect_error([&] { inline_algo.create(too_big, g, 0); }, Errc::kInvalidArgument, "4100 B",
                             "created an inline all-reduce of 4100 B");
    checked_allreduce(g, 0, "inline", DataType::kInt32, ReduceOp::kSum, 3, true);  // still in step
  });
  expect_declines_alone("inline", 2);
  expect_declines_across_hosts("inline", 2);
}

TEST(InlineAllreduce, TheTableChoosesItUpToFourKiBOnOneHost) {
  with_arena(2, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    const AlgorithmOverrides none;
    for (const std::size_t bytes : {std::size_t{8}, std::size_t{64}, kMaxBytes}) {
      EXPECT_EQ(select_algorithm(make_allreduce_args(DataType::kUInt8, ReduceOp::kSum, bytes), g, none).name, "inline");
    }
    EXPECT_EQ(select_algorithm(make_allreduce_args(DataType::kUInt8, ReduceOp::kSum, kMaxBytes + 1), g, none).name,
              "shm");
  });
}

TEST(InlineAllreduce, RefusesBitwiseOpsOnFloatsBeforeTakingASequenceNumber) {
  expect_refuses_bitwise_on_floats("inline", 4, 5);
}

// Every rank reduces every contribution itself: in the same order, so to the same bits.
class InlineBitwise : public ::testing::TestWithParam<int> {};

TEST_P(InlineBitwise, EveryRankHoldsTheSameFloatBits) {
  with_arena(GetParam(), [](const Group& g, transport::Bootstrap& b, transport::Mesh&) {
    for (const DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
      const std::size_t count = kMaxBytes / dtype_size(dtype) - 1;
      std::vector<std::byte> data(count * dtype_size(dtype));
      fill_random_floats(dtype, data.data(), count, g.rank());
      reduce_to_same_bits(b, g, "inline", 0, dtype, ReduceOp::kSum, data);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, InlineBitwise, ::testing::Values(2, 3, 5), ranks_name);

// Inline and shm operations in every order of parities: both reuse the
// arena's sequence numbers, and neither may overwrite what the other's
// slow peer still reads.
class InlineBackToBack : public ::testing::TestWithParam<int> {};

TEST_P(InlineBackToBack, ThousandsOfOperationsMixedWithShmAllChecked) {
  with_arena(GetParam(), [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    struct Case {
      std::size_t count;
      const char* algorithm;
    };
    // Five cases: an odd cycle, so each meets both parities after each other.
    constexpr Case kCases[] = {{2, "inline"}, {1024, "inline"}, {300, "shm"}, {13, "inline"}, {70001, "shm"}};
    const int iterations = g.size() <= 2 ? 1000 : 300;
    std::vector<std::int32_t> data;
    for (int it = 0; it < iterations; ++it) {
      const Case& c = kCases[static_cast<std::size_t>(it) % std::size(kCases)];
      ASSERT_EQ(wrong_in_int32_sum(g, c.algorithm, it, c.count, data), 0u)
          << "iteration " << it << ", " << c.algorithm << " of " << c.count;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, InlineBackToBack, ::testing::Values(2, 3), ranks_name);

// Operations created at once and progressed in reverse order: each waits for
// its turn behind the earlier ones (inline or shm), and all finish right.
TEST(InlineAllreduce, SeveralInFlightFinishInTheirOwnOrder) {
  with_arena(3, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    expect_in_flight_finish_in_order(g, {5, 1024, 70001, 1, 3000, 7}, [](const CollArgs& args) {
      return args.bytes() <= kMaxBytes ? "inline" : "shm";
    });
  });
}

TEST(InlineAllreduce, RankKilledWhilePeersWaitOnItsBoxIsNamedWithinTheTimeout) {
  expect_killed_rank_named("inline", 2);
}

}  // namespace
}  // namespace dlop::coll
