// Allreduce between real processes: every algorithm x ranks x counts, the
// full dtype x op matrix at small counts and representative pairs at 1Mi+3
// elements, in and out of place, checked against an exact reference; several
// allreduces in flight at once; and bitwise-identical float results on every
// rank. Reduce-scatter and allgather have their own files.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.hpp"
#include "reduction_check.hpp"

namespace dlop::coll {
namespace {

using namespace ref;

constexpr const char* kAlgorithms[] = {"ring", "recursive_doubling", "rabenseifner"};
constexpr std::size_t kSmallCounts[] = {0, 1, 7, 1023};

// "ring_ranks3": test names by algorithm and ranks.
template <typename Info>
std::string algo_ranks_name(const Info& info) {
  return std::string(std::get<0>(info.param)) + "_ranks" + std::to_string(std::get<1>(info.param));
}

// --- the full matrix at small counts ---------------------------------------

class AllreduceSmall : public ::testing::TestWithParam<std::tuple<const char*, int, std::size_t>> {};

TEST_P(AllreduceSmall, EveryDtypeAndOpInAndOutOfPlace) {
  const auto [algo, ranks, count] = GetParam();
  on_ranks(ranks, [&](const Group& g, auto next_tag, transport::Bootstrap&) {
    for_each_supported_pair([&](DataType dtype, ReduceOp op) {
      for (const bool in_place : {false, true}) checked_allreduce(g, next_tag(), algo, dtype, op, count, in_place);
    });
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, AllreduceSmall,
                         ::testing::Combine(::testing::ValuesIn(kAlgorithms), ::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::ValuesIn(kSmallCounts)),
                         [](const auto& param_info) {
                           const std::size_t count = std::get<2>(param_info.param);
                           return algo_ranks_name(param_info) + "_count" + std::to_string(count);
                         });

// --- representative pairs at 1Mi+3 elements ----------------------------------

class AllreduceLarge : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(AllreduceLarge, RepresentativePairs) {
  const auto [algo, ranks] = GetParam();
  on_ranks(ranks, [&](const Group& g, auto next_tag, transport::Bootstrap&) {
    for (const Pair& p : kRepresentativePairs) checked_allreduce(g, next_tag(), algo, p.dtype, p.op, kLargeCount, p.in_place);
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, AllreduceLarge,
                         ::testing::Combine(::testing::ValuesIn(kAlgorithms), ::testing::Values(1, 2, 3, 4, 5)),
                         [](const auto& param_info) {
                           return algo_ranks_name(param_info) + "_count" + std::to_string(kLargeCount);
                         });

// --- several allreduces in flight on one group -------------------------------

class AllreduceConcurrent : public ::testing::TestWithParam<int> {};

TEST_P(AllreduceConcurrent, FourInFlightProgressedRoundRobin) {
  struct Op {
    const char* algo;
    DataType dtype;
    ReduceOp op;
    std::size_t count;
  };
  constexpr Op kOps[] = {
      {"ring", DataType::kFloat32, ReduceOp::kSum, 300001},        // several chunks per block
      {"recursive_doubling", DataType::kInt32, ReduceOp::kMax, 100003},
      {"rabenseifner", DataType::kBFloat16, ReduceOp::kAvg, 700001},  // two slices
      {"ring", DataType::kInt64, ReduceOp::kBxor, 1023},
  };
  on_ranks(GetParam(), [&](const Group& g, auto next_tag, transport::Bootstrap&) {
    std::vector<std::vector<std::byte>> inputs, outputs;
    std::vector<std::unique_ptr<Task>> tasks;
    for (const Op& o : kOps) {
      const std::uint64_t seed = case_seed(o.dtype, o.op, o.count);
      inputs.push_back(make_input(o.dtype, o.op, g.rank(), o.count, seed));
      outputs.emplace_back(o.count * dtype_size(o.dtype) + kGuardBytes, std::byte{kGuard});
      CollArgs args = make_allreduce_args(o.dtype, o.op, o.count);
      args.send = inputs.back().data();
      args.recv = outputs.back().data();
      tasks.push_back(test::find_algorithm(CollKind::kAllreduce, o.algo).create(args, g, next_tag()));
    }
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    std::vector<bool> done(tasks.size(), false);
    while (std::count(done.begin(), done.end(), false) > 0) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "concurrent allreduces did not finish";
      for (std::size_t i = 0; i < tasks.size(); ++i) {
        if (!done[i]) done[i] = tasks[i]->progress();
      }
    }
    for (std::size_t i = 0; i < std::size(kOps); ++i) {
      const Op& o = kOps[i];
      check_reduced(o.dtype, o.op, g.size(), outputs[i].data(), 0, o.count, case_seed(o.dtype, o.op, o.count),
                    std::string("concurrent ") + o.algo);
      EXPECT_TRUE(guard_intact(outputs[i], o.count * dtype_size(o.dtype))) << o.algo << ": wrote past the end";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllreduceConcurrent, ::testing::Values(2, 3, 4, 5), ranks_name);

// --- bitwise identical float results on every rank ---------------------------

class AllreduceBitwise : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(AllreduceBitwise, EveryRankHoldsTheSameFloatBits) {
  const auto [algo, ranks] = GetParam();
  constexpr std::size_t kCount = 70001;
  on_ranks(ranks, [&](const Group& g, auto next_tag, transport::Bootstrap& b) {
    for (const DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
        std::vector<std::byte> data(kCount * dtype_size(dtype));
        fill_random_floats(dtype, data.data(), kCount, g.rank());
        reduce_to_same_bits(b, g, algo, next_tag(), dtype, op, data);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, AllreduceBitwise,
                         ::testing::Combine(::testing::ValuesIn(kAlgorithms), ::testing::Values(4, 5)),
                         [](const auto& param_info) { return algo_ranks_name(param_info); });

// --- registration and argument checks ----------------------------------------

TEST(AllreduceFamily, RegistersEveryAlgorithmUnderItsDlopAlgoName) {
  for (const char* algo : kAlgorithms) EXPECT_NO_THROW(test::find_algorithm(CollKind::kAllreduce, algo)) << algo;
  EXPECT_NO_THROW(test::find_algorithm(CollKind::kReduceScatter, "ring"));
  EXPECT_NO_THROW(test::find_algorithm(CollKind::kReduceScatterv, "ring"));
  EXPECT_NO_THROW(test::find_algorithm(CollKind::kAllgather, "ring"));
  EXPECT_NO_THROW(test::find_algorithm(CollKind::kAllgather, "bruck"));
  EXPECT_NO_THROW(test::find_algorithm(CollKind::kAllgatherv, "ring"));
  const auto forced = AlgorithmOverrides::parse(
      "allreduce:ring,allreduce:recursive_doubling,allreduce:rabenseifner,reducescatter:ring,reducescatterv:ring,"
      "allgather:ring,allgather:bruck,allgatherv:ring");
  EXPECT_EQ(forced.forced.size(), 8u);
}

TEST(AllreduceFamily, BitwiseReductionOfFloatsIsRefusedBeforeAnythingIsPosted) {
  on_ranks(2, [](const Group& g, auto next_tag, transport::Bootstrap&) {
    std::vector<float> data(16, 1.0f);
    CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kBxor, data.size());
    args.send = args.recv = data.data();
    for (const char* algo : kAlgorithms) {
      try {
        test::find_algorithm(CollKind::kAllreduce, algo).create(args, g, next_tag());
        ADD_FAILURE() << algo << " accepted bxor on floats";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::kInvalidArgument) << algo;
      }
    }
    args.kind = CollKind::kReduceScatter;
    args.count = 8;
    EXPECT_THROW(test::find_algorithm(CollKind::kReduceScatter, "ring").create(args, g, next_tag()), Error);
  });
}

}  // namespace
}  // namespace dlop::coll
