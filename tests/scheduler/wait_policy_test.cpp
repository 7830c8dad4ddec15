// The wait policy (core/wait_policy.hpp) under the engine: ranks pinned to a
// core each spin and ranks sharing one yield, on one host or as network
// namespaces of one machine, and collectives stay exact and bounded with
// twice as many ranks as cores (where waits yield). The policy on its own is
// tested with core (tests/core/wait_policy_test.cpp).
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/multiprocess.hpp"
#include "common/netns.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/machine_cores.hpp"
#include "core/wait_policy.hpp"
#include "scheduler/communicator.hpp"

namespace dlop::sched {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The cores this process may use alone: its affinity, capped by its cgroup quota.
CoreBudget own_cores() { return shared_cores({RankCores::self()}, 0).budget; }

// Two ranks pinned before their engines start, each after `place(rank)`
// (which returns what failed, or nothing): to different CPUs they spin, to
// the same one they yield, and their all-reduce is exact either way.
template <typename Place>
void pinned_ranks_spin_apart_and_yield_together(Place&& place) {
  const std::vector<int> cpus = allowed_cpus();
  for (const bool shared : {false, true}) {
    test::run_ranks(2, [&](transport::Bootstrap& b) {
      const std::string error = place(b.rank());
      ASSERT_TRUE(error.empty()) << error;
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[shared ? 0 : static_cast<std::size_t>(b.rank())], &one);
      ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
      auto comm = Communicator::create(b);
      EXPECT_EQ(WaitPolicy::process().mode(), shared ? WaitMode::kYield : WaitMode::kSpin)
          << (shared ? "both on one CPU" : "a CPU each");
      std::vector<float> x(1001, static_cast<float>(b.rank() + 1));
      comm->allreduce(x.data(), x.data(), x.size(), coll::DataType::kFloat32, coll::ReduceOp::kSum).wait();
      EXPECT_EQ(x, std::vector<float>(1001, 3.0f));
    });
  }
}

// Why the pinned tests cannot run here, or nothing.
std::string cannot_pin_two_ranks() {
  if (allowed_cpus().size() < 2 || own_cores().cores < 2) return "needs 2 CPUs: " + own_cores().why;
  if (config().progress != ProgressMode::kAuto) return "DLOP_PROGRESS names a mode";
  return {};
}

TEST(WaitPolicy, RanksPinnedToACoreEachSpinAndRanksSharingOneYield) {
  if (const std::string why = cannot_pin_two_ranks(); !why.empty()) GTEST_SKIP() << why;
  pinned_ranks_spin_apart_and_yield_together([](int) { return std::string(); });
}

// The same, with each rank in a network namespace of its own: two hosts to
// the transport, one machine's cores to the wait policy.
TEST(WaitPolicy, RanksOfNamespaceHostsCountAsRanksOfTheirMachine) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces (ip netns)";
  if (const std::string why = cannot_pin_two_ranks(); !why.empty()) GTEST_SKIP() << why;
  test::NetnsHosts hosts(2);
  if (!hosts.failed().empty()) GTEST_SKIP() << "cannot make network namespaces here: " << hosts.failed();
  pinned_ranks_spin_apart_and_yield_together([&hosts](int rank) { return test::enter_netns(hosts.name(rank)); });
}

// Twice as many ranks as this process may use cores (at least 4): every
// waiting rank yields, and results stay exact.
int crowded_ranks() { return std::clamp(static_cast<int>(std::ceil(own_cores().cores)) * 2, 4, 8); }

TEST(WaitPolicy, CollectivesWithTwiceAsManyRanksAsCoresAreExact) {
  const int n = crowded_ranks();
  test::run_ranks(n, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    if (comm->size() > own_cores().cores) {
      EXPECT_EQ(WaitPolicy::process().mode(), WaitMode::kYield);
    }
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001},
                                    std::size_t{3} << 18}) {
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<std::int64_t> data(count);
        for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<std::int64_t>(i) * (comm->rank() + 1) + rep;
        comm->allreduce(data.data(), data.data(), count, coll::DataType::kInt64, coll::ReduceOp::kSum).wait();
        const std::int64_t ranks_sum = comm->size() * (comm->size() + 1) / 2;
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(data[i], static_cast<std::int64_t>(i) * ranks_sum + rep * comm->size()) << count << " at " << i;
        }
      }
      std::vector<float> value(count + 1, static_cast<float>(comm->rank()));
      comm->broadcast(value.data(), value.size(), coll::DataType::kFloat32, comm->size() - 1).wait();
      ASSERT_EQ(value, std::vector<float>(count + 1, static_cast<float>(comm->size() - 1)));
    }
    comm->barrier().wait();
  });
}

TEST(WaitPolicy, ASilentRankAmongTwiceAsManyRanksAsCoresTimesOutInTime) {
  const int n = crowded_ranks();
  test::run_ranks(n, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    if (comm->rank() != comm->size() - 1) {
      double x = 1;
      const auto start = Clock::now();
      try {
        comm->allreduce(&x, &x, 1, coll::DataType::kFloat64, coll::ReduceOp::kSum, {.timeout = 1s}).wait();
        ADD_FAILURE() << "no timeout";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::kTimeout) << e.what();
      }
      EXPECT_LT(Clock::now() - start, 10s);  // a bound, not a speed: the 1 s timeout, not a hang
    }
    b.barrier(60s);  // the last rank submits nothing until the others timed out
  });
}

}  // namespace
}  // namespace dlop::sched