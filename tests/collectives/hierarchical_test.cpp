// Allreduce on ranks spread over several "hosts" (the mesh's host option, as
// DLOP_HOST_ID sets it; ranks of different hosts talk over the network
// transports): "hierarchical" forced over groupings even and uneven, the full
// dtype x op matrix at small counts and representative pairs at 1Mi+3
// elements (several pipeline segments), in and out of place, against the
// exact reference; bitwise-identical floats on every rank; which algorithm
// the table picks and which decline; the other allreduce algorithms on the
// same groupings; and the default selection through the scheduler's
// Communicator on 2 hosts x 2 ranks.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "common/multiprocess.hpp"
#include "core/error.hpp"
#include "core/process.hpp"
#include "reduction_check.hpp"
#include "scheduler/communicator.hpp"

namespace dlop::coll {
namespace {

using namespace ref;

struct Grouping {
  const char* name;
  std::vector<std::string> hosts;  // host of rank r
};

// Even, uneven, interleaved (a host's ranks not contiguous, so the leaders
// are not the first ranks), a leader alone on its host, and three hosts.
const Grouping kGroupings[] = {
    {"2x2", {"A", "A", "B", "B"}},
    {"3and2", {"A", "A", "A", "B", "B"}},
    {"interleaved", {"A", "B", "A", "B"}},
    {"1and2", {"A", "B", "B"}},
    {"1and2and2", {"A", "B", "B", "C", "C"}},
};

// GoogleTest prints parameters in test listings (ctest's test names).
void PrintTo(const Grouping& grouping, std::ostream* out) { *out << grouping.name; }

constexpr std::size_t kSmallCounts[] = {0, 1, 7, 1023};

template <typename Body>
void on_hosts(const std::vector<std::string>& hosts, Body body) {
  test::run_on_hosts(hosts, [&body](transport::Bootstrap& b, const Group& group, const auto& next_tag) {
    body(group, next_tag, b);
  });
}

// checked_allreduce(), and the result bitwise alike on every rank.
template <typename NextTag>
void allreduce_case(const Group& g, NextTag& next_tag, transport::Bootstrap& b, std::string_view algo,
                    DataType dtype, ReduceOp op, std::size_t count, bool in_place) {
  const auto result = checked_allreduce(g, next_tag(), algo, dtype, op, count, in_place);
  expect_same_bits_on_every_rank(b, result.data(), count * dtype_size(dtype),
                            std::string(algo) + " " + pair_name(dtype, op) + (in_place ? " in place" : ""));
}

// kRepresentativePairs, and integer AVG: one truncating division of the whole sum.
const std::vector<Pair> kLargePairs = [] {
  std::vector<Pair> pairs(std::begin(kRepresentativePairs), std::end(kRepresentativePairs));
  pairs.push_back({DataType::kInt32, ReduceOp::kAvg, true});
  return pairs;
}();

// --- "hierarchical" forced: the full matrix at small counts ------------------

class HierarchicalSmall : public ::testing::TestWithParam<std::tuple<Grouping, std::size_t>> {};

TEST_P(HierarchicalSmall, EveryDtypeAndOpInAndOutOfPlace) {
  const auto& [grouping, count] = GetParam();
  on_hosts(grouping.hosts, [&](const Group& g, auto next_tag, transport::Bootstrap& b) {
    for_each_supported_pair([&](DataType dtype, ReduceOp op) {
      for (const bool in_place : {false, true}) {
        allreduce_case(g, next_tag, b, "hierarchical", dtype, op, count, in_place);
      }
    });
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, HierarchicalSmall,
                         ::testing::Combine(::testing::ValuesIn(kGroupings), ::testing::ValuesIn(kSmallCounts)),
                         [](const auto& param_info) {
                           return std::string(std::get<0>(param_info.param).name) + "_count" +
                                  std::to_string(std::get<1>(param_info.param));
                         });

// --- "hierarchical" forced: representative pairs at 1Mi+3 elements -----------

class HierarchicalLarge : public ::testing::TestWithParam<Grouping> {};

TEST_P(HierarchicalLarge, RepresentativePairsOverSeveralSegments) {
  on_hosts(GetParam().hosts, [&](const Group& g, auto next_tag, transport::Bootstrap& b) {
    for (const Pair& p : kLargePairs) {
      allreduce_case(g, next_tag, b, "hierarchical", p.dtype, p.op, kLargeCount, p.in_place);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, HierarchicalLarge, ::testing::ValuesIn(kGroupings),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// --- bitwise identical float results on every rank ---------------------------

class HierarchicalBitwise : public ::testing::TestWithParam<Grouping> {};

TEST_P(HierarchicalBitwise, EveryRankHoldsTheSameFloatBits) {
  on_hosts(GetParam().hosts, [&](const Group& g, auto next_tag, transport::Bootstrap& b) {
    for (const DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
        // f32 sum also over three segments of the pipeline.
        const std::size_t count = dtype == DataType::kFloat32 && op == ReduceOp::kSum ? (2u << 20) + 9 : 70001;
        std::vector<std::byte> data(count * dtype_size(dtype));
        fill_random_floats(dtype, data.data(), count, g.rank());
        CollArgs args = make_allreduce_args(dtype, op, count);
        args.send = args.recv = data.data();
        run(g, args, "hierarchical", next_tag());
        expect_same_bits_on_every_rank(b, data.data(), data.size(), "hierarchical " + pair_name(dtype, op));
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, HierarchicalBitwise, ::testing::Values(kGroupings[0], kGroupings[1]),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// --- selection: who accepts, what the table picks -----------------------------

std::string_view table_choice(const Group& g, std::size_t count) {
  CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, count);
  return select_algorithm(args, g, AlgorithmOverrides{}).name;
}

TEST(HierarchicalSelection, TablePicksItAcrossHostsWithSharedHostsOnly) {
  // 2 hosts x 2 ranks: recursive doubling for small vectors, then hierarchical.
  on_hosts({"A", "A", "B", "B"}, [](const Group& g, auto, transport::Bootstrap&) {
    EXPECT_EQ(g.hosts(), 2);
    EXPECT_EQ(table_choice(g, 16), "recursive_doubling");
    EXPECT_EQ(table_choice(g, 1u << 20), "hierarchical");
    const CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, 1u << 20);
    EXPECT_FALSE(test::find_algorithm(CollKind::kAllreduce, "cma").accepts(args, g)) << "cma across hosts";
    EXPECT_EQ(select_algorithm(args, g, AlgorithmOverrides::parse("allreduce:cma")).name, "hierarchical");
  });
  // One rank per host: nothing to fold in, it declines (256 KiB: to Rabenseifner).
  on_hosts({"A", "B", "C"}, [](const Group& g, auto, transport::Bootstrap&) {
    const CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, 1u << 16);
    EXPECT_FALSE(test::find_algorithm(CollKind::kAllreduce, "hierarchical").accepts(args, g));
    EXPECT_EQ(select_algorithm(args, g, AlgorithmOverrides::parse("allreduce:hierarchical")).name, "rabenseifner");
    EXPECT_EQ(table_choice(g, 1u << 20), "ring");
  });
  // One host: it declines, the intra-host algorithm serves.
  on_hosts({"A", "A", "A"}, [](const Group& g, auto, transport::Bootstrap&) {
    const CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, 1u << 20);
    EXPECT_FALSE(test::find_algorithm(CollKind::kAllreduce, "hierarchical").accepts(args, g));
    EXPECT_NE(table_choice(g, 1u << 20), "hierarchical");
  });
}

TEST(HierarchicalSelection, OneRankPerHostGetsExactResultsFromTheTable) {
  on_hosts({"A", "B"}, [](const Group& g, auto next_tag, transport::Bootstrap& b) {
    for (const std::size_t count : {std::size_t{7}, kLargeCount}) {
      for (const bool in_place : {false, true}) {
        const CollArgs args = make_allreduce_args(DataType::kInt32, ReduceOp::kSum, count);
        allreduce_case(g, next_tag, b, select_algorithm(args, g, AlgorithmOverrides{}).name, DataType::kInt32,
                       ReduceOp::kSum, count, in_place);
      }
    }
  });
}

// --- the other allreduce algorithms across hosts ------------------------------

class OtherAlgorithmsAcrossHosts : public ::testing::TestWithParam<Grouping> {};

TEST_P(OtherAlgorithmsAcrossHosts, AcceptOnlyWhatTheyServeAndGiveExactResults) {
  on_hosts(GetParam().hosts, [&](const Group& g, auto next_tag, transport::Bootstrap& b) {
    for (const Algorithm& a : all_algorithms()) {
      if (a.kind != CollKind::kAllreduce || a.name == "hierarchical") continue;
      const CollArgs probe = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, 1023);
      if (a.name == "cma") {
        EXPECT_FALSE(a.accepts(probe, g)) << "cma accepted ranks on several hosts";
        continue;
      }
      if (!a.accepts(probe, g)) continue;
      for (const std::size_t count : {std::size_t{7}, std::size_t{1023}}) {
        for (const bool in_place : {false, true}) {
          allreduce_case(g, next_tag, b, a.name, DataType::kFloat32, ReduceOp::kSum, count, in_place);
          allreduce_case(g, next_tag, b, a.name, DataType::kInt16, ReduceOp::kBxor, count, in_place);
        }
      }
      allreduce_case(g, next_tag, b, a.name, DataType::kFloat16, ReduceOp::kAvg, kLargeCount, false);
      allreduce_case(g, next_tag, b, a.name, DataType::kInt64, ReduceOp::kMax, kLargeCount, true);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, OtherAlgorithmsAcrossHosts, ::testing::Values(kGroupings[0], kGroupings[1]),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// --- the default selection through the scheduler's Communicator ---------------

// The engine's mesh takes its host from DLOP_HOST_ID, read once per process:
// each rank sets it before anything reads the configuration. A process that
// read it already (other tests in the same run) cannot be regrouped, and the
// test is skipped there; ctest runs every test in a fresh process.
constexpr int kRegroupImpossible = 77;

TEST(HierarchicalCommunicator, DefaultSelectionOnTwoHostsOfTwoGivesExactResults) {
  const std::vector<std::string> hosts = {"hier-A", "hier-A", "hier-B", "hier-B"};
  test::RankGroup ranks(4, [&hosts](transport::Bootstrap& b) {
    const std::string& host = hosts.at(static_cast<std::size_t>(b.rank()));
    ::setenv("DLOP_HOST_ID", host.c_str(), 1);
    if (host_identity() != host) std::_Exit(kRegroupImpossible);
    auto comm = sched::Communicator::create(b);
    EXPECT_EQ(comm->hosts(), 2);
    for (const std::size_t count : {std::size_t{0}, std::size_t{7}, std::size_t{1023}, kLargeCount}) {
      for (const Pair& p : kLargePairs) {
        const std::uint64_t seed = case_seed(p.dtype, p.op, count);
        auto input = make_input(p.dtype, p.op, comm->rank(), count, seed);
        std::vector<std::byte> output(p.in_place ? 0 : input.size(), std::byte{kGuard});
        void* recv = p.in_place ? input.data() : output.data();
        comm->allreduce(input.data(), recv, count, p.dtype, p.op).wait();
        const std::string what = "communicator count " + std::to_string(count);
        check_reduced(p.dtype, p.op, comm->size(), recv, 0, count, seed, what);
        EXPECT_TRUE(guard_intact(p.in_place ? input : output, count * dtype_size(p.dtype))) << what;
        expect_same_bits_on_every_rank(b, recv, count * dtype_size(p.dtype), what + " " + pair_name(p.dtype, p.op));
      }
    }
    comm->barrier().wait();
  });
  const auto exits = ranks.wait(std::chrono::minutes(4));
  if (std::all_of(exits.begin(), exits.end(), [](const test::RankExit& e) { return e.exited && e.code == kRegroupImpossible; })) {
    GTEST_SKIP() << "DLOP_HOST_ID was read before the ranks forked; run this test in a process of its own";
  }
  for (const test::RankExit& e : exits) {
    EXPECT_TRUE(e.exited && e.code == 0) << "rank " << e.rank << (e.exited ? " exited with " : " killed by signal ")
                                         << e.code;
  }
}

}  // namespace
}  // namespace dlop::coll
