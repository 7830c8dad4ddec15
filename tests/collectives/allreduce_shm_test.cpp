// The shared-memory all-reduce ("shm") between real processes, each group
// with its host arena attached: the grid of ranks x counts x every dtype/op
// pair in and out of place against the exact reference; bitwise-identical
// floats on every rank; thousands of operations back to back and several in
// flight at once (slot reuse by parity); a rank killed while its peers wait on
// its flag; and when the algorithm declines.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "reduction_check.hpp"

namespace dlop::coll {
namespace {

using namespace ref;

constexpr std::size_t kGridCounts[] = {0, 1, 7, 1023, kLargeCount};

// Every rank count meets the small counts; the large count (many rounds of every slot, a remainder)
// runs on the fewest and the most ranks: at 3 and 4 ranks it walks the same paths at the same
// per-rank block sizes and cost a minute of the suite (and more under ASan).
std::vector<std::tuple<int, std::size_t>> grid() {
  std::vector<std::tuple<int, std::size_t>> cases;
  for (const int ranks : {2, 3, 4, 5}) {
    for (const std::size_t count : kGridCounts) {
      if (count != kLargeCount || ranks == 2 || ranks == 5) cases.emplace_back(ranks, count);
    }
  }
  return cases;
}

// --- the grid: ranks x counts x every dtype/op pair, in and out of place -----

class ShmGrid : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(ShmGrid, EveryDtypeAndOpInAndOutOfPlace) {
  const auto [ranks, count] = GetParam();
  with_arena(ranks, [&, count = count](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    for_each_supported_pair([&](DataType dtype, ReduceOp op) {
      for (const bool in_place : {false, true}) checked_allreduce(g, 0, "shm", dtype, op, count, in_place);
    });
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, ShmGrid,
                         ::testing::ValuesIn(grid()),
                         [](const auto& param_info) {
                           return fmt::format("ranks{}_count{}", std::get<0>(param_info.param), std::get<1>(param_info.param));
                         });

// One rank: there is no arena (nothing to share), the algorithm declines and
// a forced "allreduce:shm" falls back to the tuning table.
TEST(ShmAllreduce, OneRankDeclinesAndTheTableServes) { expect_declines_alone("shm", 7); }

TEST(ShmAllreduce, DeclinesAcrossHosts) { expect_declines_across_hosts("shm", 7); }

TEST(ShmAllreduce, RefusesBitwiseOpsOnFloatsBeforeTakingASequenceNumber) {
  expect_refuses_bitwise_on_floats("shm", 16, 1023);
}

// --- bitwise-identical floats on every rank ----------------------------------

class ShmBitwise : public ::testing::TestWithParam<int> {};

TEST_P(ShmBitwise, EveryRankHoldsTheSameFloatBits) {
  with_arena(GetParam(), [](const Group& g, transport::Bootstrap& b, transport::Mesh&) {
    // Small (one exchange), medium (one round) and several rounds.
    for (const std::size_t count : {std::size_t{1001}, std::size_t{70001}, std::size_t{700001}}) {
      for (const DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
        std::vector<std::byte> data(count * dtype_size(dtype));
        for (std::size_t i = 0; i < data.size(); ++i) {
          // Full mantissas and a modest exponent range: sums round differently in another order.
          data[i] = static_cast<std::byte>(hash(0xF10A7 + count, g.rank(), i) & (i % 2 == 1 ? 0x3F : 0xFF));
        }
        reduce_to_same_bits(b, g, "shm", 0, dtype, ReduceOp::kSum, data);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmBitwise, ::testing::Values(2, 3, 5), ranks_name);

// --- many operations back to back: both parities reused over and over --------

class ShmBackToBack : public ::testing::TestWithParam<int> {};

TEST_P(ShmBackToBack, ThousandsOfOperationsAllChecked) {
  with_arena(GetParam(), [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    // Small, medium, and several rounds; an odd number of sizes so each size
    // meets both parities.
    constexpr std::size_t kCounts[] = {1, 300, 5000, 70001, 600001};
    const int iterations = g.size() <= 2 ? 3000 : 600;
    std::vector<std::int32_t> data;
    std::size_t wrong = 0;
    for (int it = 0; it < iterations; ++it) {
      const std::size_t count = kCounts[static_cast<std::size_t>(it) % std::size(kCounts)];
      if (count > 100000 && it % 10 != it % 5) continue;  // keep the large ones rarer
      wrong += wrong_in_int32_sum(g, "shm", it, count, data);
      ASSERT_EQ(wrong, 0u) << "iteration " << it << ", count " << count;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmBackToBack, ::testing::Values(2, 3, 4), ranks_name);

// Several operations created at once and progressed in reverse order: each
// waits for its turn, and all finish with their own results.
TEST(ShmAllreduce, SeveralInFlightFinishInTheirOwnOrder) {
  with_arena(3, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    expect_in_flight_finish_in_order(g, {5, 600001, 3000, 70001, 1, 20000}, [](const CollArgs&) { return "shm"; });
  });
}

// --- a rank killed while its peers wait on its flag --------------------------

TEST(ShmAllreduce, RankKilledWhilePeersWaitOnItsFlagIsNamedWithinTheTimeout) {
  for (const std::size_t count : {std::size_t{7}, std::size_t{600001}}) expect_killed_rank_named("shm", count);
}

}  // namespace
}  // namespace dlop::coll
