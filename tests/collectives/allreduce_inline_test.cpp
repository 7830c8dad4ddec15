// The inline all-reduce ("inline": inputs of up to 4 KiB carried next to the
// sequence number in the host arena's boxes) between real processes: every
// dtype/op pair in and out of place at counts around the one-line and the
// 4 KiB limits against the exact reference; bitwise-identical floats on every
// rank; thousands of operations interleaved with shm ones (both share the
// arena's sequence and parities); several in flight at once; a rank killed
// while its peers wait on its box; and when the algorithm declines.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <signal.h>

#include <cstring>

#include "core/error.hpp"
#include "reduction_check.hpp"

namespace dlop::coll {
namespace {

using namespace ref;
using Clock = std::chrono::steady_clock;

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
    for (const DataType dtype : kAllDtypes) {
      for (const ReduceOp op : kAllOps) {
        if (!supports(op, dtype)) continue;
        for (const std::size_t count : counts_for(dtype)) {
          for (const bool in_place : {false, true}) checked_allreduce(g, 0, "inline", dtype, op, count, in_place);
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, InlineGrid, ::testing::Values(2, 3, 4, 5),
                         [](const auto& param_info) { return "ranks" + std::to_string(param_info.param); });

TEST(InlineAllreduce, DeclinesAboveFourKiBOneRankAndAcrossHosts) {
  with_arena(2, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    const Algorithm& inline_algo = test::find_algorithm(CollKind::kAllreduce, "inline");
    EXPECT_TRUE(inline_algo.accepts(make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, kMaxBytes / 4), g));
    const CollArgs too_big = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, kMaxBytes / 4 + 1);
    EXPECT_FALSE(inline_algo.accepts(too_big, g));
    EXPECT_EQ(select_algorithm(too_big, g, AlgorithmOverrides::parse("allreduce:inline")).name, "shm");
    try {
      inline_algo.create(too_big, g, 0);
      ADD_FAILURE() << "created an inline all-reduce of 4100 B";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("4100 B"), std::string::npos) << e.what();
    }
    checked_allreduce(g, 0, "inline", DataType::kInt32, ReduceOp::kSum, 3, true);  // still in step
  });
  with_arena(1, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    const CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, 2);
    EXPECT_FALSE(test::find_algorithm(CollKind::kAllreduce, "inline").accepts(args, g));
    EXPECT_NE(select_algorithm(args, g, AlgorithmOverrides::parse("allreduce:inline")).name, "inline");
  });
  test::run_ranks(2, [](transport::Bootstrap& b) {
    transport::UcxWorker worker;
    transport::Mesh::Options options;
    options.host = "host-" + std::to_string(b.rank());
    transport::Mesh mesh(worker, b, options);
    Group group(mesh, {0, 1});
    attach_host_arena(group, b, agree_on_name(b), 60s);
    const CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, 2);
    EXPECT_FALSE(test::find_algorithm(CollKind::kAllreduce, "inline").accepts(args, group));
    mesh.fence(30s);
  });
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
  with_arena(2, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    std::vector<float> data(4, 1.0f);
    CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kBxor, data.size());
    args.send = args.recv = data.data();
    EXPECT_THROW(test::find_algorithm(CollKind::kAllreduce, "inline").create(args, g, 0), Error);
    checked_allreduce(g, 0, "inline", DataType::kFloat32, ReduceOp::kSum, 5, false);  // the arena is still in step
  });
}

// Every rank reduces every contribution itself: in the same order, so to the same bits.
class InlineBitwise : public ::testing::TestWithParam<int> {};

TEST_P(InlineBitwise, EveryRankHoldsTheSameFloatBits) {
  with_arena(GetParam(), [](const Group& g, transport::Bootstrap& b, transport::Mesh&) {
    for (const DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
      const std::size_t count = kMaxBytes / dtype_size(dtype) - 1;
      std::vector<std::byte> data(count * dtype_size(dtype));
      fill_random_floats(dtype, data.data(), count, g.rank());
      CollArgs args = make_allreduce_args(dtype, ReduceOp::kSum, count);
      args.send = args.recv = data.data();
      run(g, args, "inline", 0);
      const std::uint64_t mine = fingerprint(data.data(), data.size());
      transport::Bytes published(sizeof(mine));
      std::memcpy(published.data(), &mine, sizeof(mine));
      const auto all = b.allgather(published, 60s);
      for (int r = 0; r < g.size(); ++r) {
        EXPECT_EQ(all[static_cast<std::size_t>(r)], published)
            << dtype_name(dtype) << " x " << count << ": rank " << r << " holds other bits than rank " << g.rank();
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, InlineBitwise, ::testing::Values(2, 3, 5),
                         [](const auto& param_info) { return "ranks" + std::to_string(param_info.param); });

// Element i of rank r at iteration it, and the sum over n ranks: exact in int32.
std::int32_t value(int rank, int it, std::size_t i) { return static_cast<std::int32_t>((i * 31 + it * 7 + rank) % 1000); }
std::int32_t sum_of(int n, int it, std::size_t i) {
  std::int32_t s = 0;
  for (int r = 0; r < n; ++r) s += value(r, it, i);
  return s;
}

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
      data.resize(c.count);
      for (std::size_t i = 0; i < c.count; ++i) data[i] = value(g.rank(), it, i);
      CollArgs args = make_allreduce_args(DataType::kInt32, ReduceOp::kSum, c.count);
      args.send = args.recv = data.data();
      run(g, args, c.algorithm, 0);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < c.count; ++i) wrong += data[i] != sum_of(g.size(), it, i);
      ASSERT_EQ(wrong, 0u) << "iteration " << it << ", " << c.algorithm << " of " << c.count;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, InlineBackToBack, ::testing::Values(2, 3),
                         [](const auto& param_info) { return "ranks" + std::to_string(param_info.param); });

// Operations created at once and progressed in reverse order: each waits for
// its turn behind the earlier ones (inline or shm), and all finish right.
TEST(InlineAllreduce, SeveralInFlightFinishInTheirOwnOrder) {
  with_arena(3, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    constexpr std::size_t kCounts[] = {5, 1024, 70001, 1, 3000, 7};
    std::vector<std::vector<std::int32_t>> data;
    std::vector<std::unique_ptr<Task>> tasks;
    for (std::size_t k = 0; k < std::size(kCounts); ++k) {
      data.emplace_back(kCounts[k]);
      for (std::size_t i = 0; i < kCounts[k]; ++i) data[k][i] = value(g.rank(), static_cast<int>(k), i);
      CollArgs args = make_allreduce_args(DataType::kInt32, ReduceOp::kSum, kCounts[k]);
      args.send = args.recv = data[k].data();
      const char* algorithm = args.bytes() <= kMaxBytes ? "inline" : "shm";
      tasks.push_back(test::find_algorithm(CollKind::kAllreduce, algorithm).create(args, g, 0));
    }
    std::vector<bool> done(tasks.size(), false);
    const auto deadline = Clock::now() + 60s;
    while (std::count(done.begin(), done.end(), false) > 0) {
      ASSERT_LT(Clock::now(), deadline) << "operations in flight did not finish";
      for (std::size_t k = tasks.size(); k-- > 0;) {
        if (!done[k]) done[k] = tasks[k]->progress();
      }
      std::this_thread::yield();
    }
    for (std::size_t k = 0; k < std::size(kCounts); ++k) {
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < kCounts[k]; ++i) wrong += data[k][i] != sum_of(g.size(), static_cast<int>(k), i);
      EXPECT_EQ(wrong, 0u) << "operation " << k << " of " << kCounts[k];
    }
  });
}

TEST(InlineAllreduce, RankKilledWhilePeersWaitOnItsBoxIsNamedWithinTheTimeout) {
  test::RankGroup ranks(3, [](transport::Bootstrap& b) {
    transport::Mesh::Options options;
    options.watchdog = 50ms;
    transport::UcxWorker worker;
    transport::Mesh mesh(worker, b, options);
    Group group(mesh, {0, 1, 2});
    attach_host_arena(group, b, agree_on_name(b), 60s);
    std::vector<float> data(2, 1.0f);
    CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, data.size());
    args.send = args.recv = data.data();
    run(group, args, "inline", 0);  // one that works, so the boxes have moved
    ASSERT_EQ(data[0], 3.0f);
    b.barrier(60s);
    if (group.rank() == 2) ::raise(SIGKILL);  // dies before posting its next input
    const auto start = Clock::now();
    try {
      run(group, args, "inline", 0);
      ADD_FAILURE() << "the all-reduce finished without rank 2";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kPeerDead) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    }
    EXPECT_LT(Clock::now() - start, 10s);
  });
  const auto exits = ranks.wait(90s);
  for (int r = 0; r < 2; ++r) {
    const auto& exit = exits[static_cast<std::size_t>(r)];
    EXPECT_TRUE(exit.exited && exit.code == 0) << "rank " << r << " failed";
  }
  EXPECT_FALSE(exits[2].exited) << "rank 2 was to die by SIGKILL";
}

}  // namespace
}  // namespace dlop::coll
