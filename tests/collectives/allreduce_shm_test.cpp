// The shared-memory all-reduce ("shm") between real processes, each group
// with its host arena attached: the grid of ranks x counts x every dtype/op
// pair in and out of place against the exact reference; bitwise-identical
// floats on every rank; thousands of operations back to back and several in
// flight at once (slot reuse by parity); a rank killed while its peers wait on
// its flag; and when the algorithm declines.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <numeric>

#include "core/error.hpp"
#include "reduction_check.hpp"

namespace dlop::coll {
namespace {

using namespace ref;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kGridCounts[] = {0, 1, 7, 1023, kLargeCount};

std::uint64_t seed_of(DataType dtype, ReduceOp op, std::size_t count) {
  return mix(static_cast<std::uint64_t>(dtype) * 977 + static_cast<std::uint64_t>(op) * 13 + count);
}

CollArgs allreduce_args(DataType dtype, ReduceOp op, std::size_t count) {
  CollArgs args;
  args.kind = CollKind::kAllreduce;
  args.dtype = dtype;
  args.op = op;
  args.count = count;
  return args;
}

void allreduce_case(const Group& g, DataType dtype, ReduceOp op, std::size_t count, bool in_place) {
  const std::uint64_t seed = seed_of(dtype, op, count);
  const std::size_t bytes = count * dtype_size(dtype);
  auto input = make_input(dtype, op, g.rank(), count, seed);
  std::vector<std::byte> output(in_place ? 0 : bytes + kGuardBytes, std::byte{kGuard});
  CollArgs args = allreduce_args(dtype, op, count);
  args.send = input.data();
  args.recv = in_place ? input.data() : output.data();
  run(g, args, "shm", 0);
  const auto& result = in_place ? input : output;
  const std::string what = fmt::format("shm {} count {}", in_place ? "in place" : "out of place", count);
  check_reduced(dtype, op, g.size(), result.data(), 0, count, seed, what);
  EXPECT_TRUE(guard_intact(result, bytes)) << what << " " << pair_name(dtype, op) << ": wrote past the end";
  if (!in_place) {
    EXPECT_EQ(input, make_input(dtype, op, g.rank(), count, seed)) << what << ": input modified";
  }
}

// --- the grid: ranks x counts x every dtype/op pair, in and out of place -----

class ShmGrid : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(ShmGrid, EveryDtypeAndOpInAndOutOfPlace) {
  const auto [ranks, count] = GetParam();
  with_arena(ranks, [&, count = count](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    for (const DataType dtype : kAllDtypes) {
      for (const ReduceOp op : kAllOps) {
        if (!supports(op, dtype)) continue;
        for (const bool in_place : {false, true}) allreduce_case(g, dtype, op, count, in_place);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, ShmGrid,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5), ::testing::ValuesIn(kGridCounts)),
                         [](const auto& param_info) {
                           return fmt::format("ranks{}_count{}", std::get<0>(param_info.param), std::get<1>(param_info.param));
                         });

// One rank: there is no arena (nothing to share), the algorithm declines and
// a forced "allreduce:shm" falls back to the tuning table.
TEST(ShmAllreduce, OneRankDeclinesAndTheTableServes) {
  with_arena(1, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    EXPECT_EQ(g.host_arena(), nullptr);
    const CollArgs args = allreduce_args(DataType::kFloat32, ReduceOp::kSum, 7);
    EXPECT_FALSE(test::find_algorithm(CollKind::kAllreduce, "shm").accepts(args, g));
    const Algorithm& chosen = select_algorithm(args, g, AlgorithmOverrides::parse("allreduce:shm"));
    EXPECT_NE(chosen.name, "shm");
  });
}

TEST(ShmAllreduce, DeclinesAcrossHosts) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    transport::UcxWorker worker;
    transport::Mesh::Options options;
    options.host = "host-" + std::to_string(b.rank());
    transport::Mesh mesh(worker, b, options);
    Group group(mesh, {0, 1});
    attach_host_arena(group, b, agree_on_name(b), 60s);  // alone on each "host": nothing mapped
    EXPECT_EQ(group.host_arena(), nullptr);
    const CollArgs args = allreduce_args(DataType::kFloat32, ReduceOp::kSum, 7);
    EXPECT_FALSE(test::find_algorithm(CollKind::kAllreduce, "shm").accepts(args, group));
    mesh.fence(30s);
  });
}

TEST(ShmAllreduce, RefusesBitwiseOpsOnFloatsBeforeTakingASequenceNumber) {
  with_arena(2, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    std::vector<float> data(16, 1.0f);
    CollArgs args = allreduce_args(DataType::kFloat32, ReduceOp::kBxor, data.size());
    args.send = args.recv = data.data();
    EXPECT_THROW(test::find_algorithm(CollKind::kAllreduce, "shm").create(args, g, 0), Error);
    allreduce_case(g, DataType::kFloat32, ReduceOp::kSum, 1023, false);  // the arena is still in step
  });
}

// --- bitwise-identical floats on every rank ----------------------------------

std::uint64_t fnv1a(const std::vector<std::byte>& bytes) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const std::byte b : bytes) h = (h ^ static_cast<std::uint64_t>(b)) * 0x100000001B3ull;
  return h;
}

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
        CollArgs args = allreduce_args(dtype, ReduceOp::kSum, count);
        args.send = args.recv = data.data();
        run(g, args, "shm", 0);
        const std::uint64_t mine = fnv1a(data);
        transport::Bytes published(sizeof(mine));
        std::memcpy(published.data(), &mine, sizeof(mine));
        const auto all = b.allgather(published, 60s);
        for (int r = 0; r < g.size(); ++r) {
          EXPECT_EQ(all[static_cast<std::size_t>(r)], published)
              << dtype_name(dtype) << " x " << count << ": rank " << r << " holds other bits than rank " << g.rank();
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmBitwise, ::testing::Values(2, 3, 5),
                         [](const auto& param_info) { return "ranks" + std::to_string(param_info.param); });

// --- many operations back to back: both parities reused over and over --------

// Element i of rank r at iteration it, and the sum over n ranks: exact in int32.
std::int32_t value(int rank, int it, std::size_t i) { return static_cast<std::int32_t>((i * 31 + it * 7 + rank) % 1000); }
std::int32_t sum_of(int n, int it, std::size_t i) {
  std::int32_t s = 0;
  for (int r = 0; r < n; ++r) s += value(r, it, i);
  return s;
}

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
      data.resize(count);
      for (std::size_t i = 0; i < count; ++i) data[i] = value(g.rank(), it, i);
      CollArgs args = allreduce_args(DataType::kInt32, ReduceOp::kSum, count);
      args.send = args.recv = data.data();
      run(g, args, "shm", 0);
      for (std::size_t i = 0; i < count; ++i) wrong += data[i] != sum_of(g.size(), it, i);
      ASSERT_EQ(wrong, 0u) << "iteration " << it << ", count " << count;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmBackToBack, ::testing::Values(2, 3, 4),
                         [](const auto& param_info) { return "ranks" + std::to_string(param_info.param); });

// Several operations created at once and progressed in reverse order: each
// waits for its turn, and all finish with their own results.
TEST(ShmAllreduce, SeveralInFlightFinishInTheirOwnOrder) {
  with_arena(3, [](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    constexpr std::size_t kCounts[] = {5, 600001, 3000, 70001, 1, 20000};
    std::vector<std::vector<std::int32_t>> data;
    std::vector<std::unique_ptr<Task>> tasks;
    for (std::size_t k = 0; k < std::size(kCounts); ++k) {
      data.emplace_back(kCounts[k]);
      for (std::size_t i = 0; i < kCounts[k]; ++i) data[k][i] = value(g.rank(), static_cast<int>(k), i);
      CollArgs args = allreduce_args(DataType::kInt32, ReduceOp::kSum, kCounts[k]);
      args.send = args.recv = data[k].data();
      tasks.push_back(test::find_algorithm(CollKind::kAllreduce, "shm").create(args, g, 0));
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

// --- a rank killed while its peers wait on its flag --------------------------

TEST(ShmAllreduce, RankKilledWhilePeersWaitOnItsFlagIsNamedWithinTheTimeout) {
  for (const std::size_t count : {std::size_t{7}, std::size_t{600001}}) {
    test::RankGroup ranks(3, [count](transport::Bootstrap& b) {
      transport::Mesh::Options options;
      options.watchdog = 50ms;
      transport::UcxWorker worker;
      transport::Mesh mesh(worker, b, options);
      Group group(mesh, {0, 1, 2});
      attach_host_arena(group, b, agree_on_name(b), 60s);
      std::vector<float> data(count, 1.0f);
      CollArgs args = allreduce_args(DataType::kFloat32, ReduceOp::kSum, count);
      args.send = args.recv = data.data();
      run(group, args, "shm", 0);  // one that works, so the flags have moved
      ASSERT_EQ(data[0], 3.0f);
      b.barrier(60s);
      if (group.rank() == 2) ::raise(SIGKILL);  // dies before posting its next input
      const auto start = Clock::now();
      try {
        run(group, args, "shm", 0);
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
      EXPECT_TRUE(exit.exited && exit.code == 0) << "count " << count << ": rank " << r << " failed";
    }
    EXPECT_FALSE(exits[2].exited) << "rank 2 was to die by SIGKILL";
  }
}

}  // namespace
}  // namespace dlop::coll
