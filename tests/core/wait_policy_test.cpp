// The wait policy (core/wait_policy.hpp) on its own: the cores a process may
// use and the ranks that share a machine's (core/machine_cores.hpp), the mode
// chosen for them, and the switch when spins lose their core. Ranks that run
// collectives under it are tested with the scheduler
// (tests/scheduler/wait_policy_test.cpp).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/machine_cores.hpp"
#include "core/wait_policy.hpp"

namespace dlop {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Runs `body` in a forked child (it changes process-wide state: the policy,
// the CPU affinity) and expects it to exit 0.
template <typename Body>
void in_child(Body&& body) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 1;
    try {
      code = body() ? 0 : 1;
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child's checks failed";
}

TEST(WaitPolicy, ReadsACgroupQuota) {
  EXPECT_EQ(parse_cgroup_cpu_max("150000 100000"), 1.5);
  EXPECT_EQ(parse_cgroup_cpu_max("50000 100000"), 0.5);
  EXPECT_FALSE(parse_cgroup_cpu_max("max 100000").has_value());
  EXPECT_FALSE(parse_cgroup_cpu_max("").has_value());
  EXPECT_FALSE(parse_cgroup_cpu_max("0 100000").has_value());
  EXPECT_FALSE(parse_cgroup_cpu_max("100000").has_value());
}

// The cores this process may use alone: its affinity, capped by its cgroup quota.
CoreBudget own_cores() { return shared_cores({RankCores::self()}, 0).budget; }

TEST(WaitPolicy, CountsTheCoresOfItsAffinity) {
  const CoreBudget all = own_cores();
  EXPECT_GE(all.cores, 0.01);
  EXPECT_LE(all.cores, std::thread::hardware_concurrency());
  EXPECT_NE(all.why.find("affinity"), std::string::npos) << all.why;
  in_child([] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(static_cast<int>(::sched_getcpu()), &one);
    if (::sched_setaffinity(0, sizeof(one), &one) != 0) return false;
    const CoreBudget b = own_cores();
    return b.cores <= 1.0 && b.why.find("may run on 1 of") != std::string::npos;
  });
}

RankCores rank_on(std::string machine, std::vector<int> cpus, std::optional<double> quota = std::nullopt,
                  std::string cgroup = {}) {
  return {.machine = std::move(machine), .cpus = std::move(cpus), .quota = quota, .quota_cgroup = std::move(cgroup)};
}

TEST(MachineCores, CountsTheRanksOfTheMachineOnTheCpusAnyOfThemMayRunOn) {
  // Bound to a core each, as mpirun --bind-to core leaves them: 2 cores,
  // though each one's affinity counts 1.
  const SharedCores bound = shared_cores({rank_on("m", {0}), rank_on("m", {1})}, 0);
  EXPECT_EQ(bound.ranks, 2);
  EXPECT_EQ(bound.budget.cores, 2.0);
  EXPECT_NE(bound.budget.why.find("machine's 2 ranks may run on 2 of"), std::string::npos) << bound.budget.why;
  EXPECT_EQ(shared_cores({rank_on("m", {0}), rank_on("m", {0})}, 1).budget.cores, 1.0);
  EXPECT_EQ(shared_cores({rank_on("m", {0, 1}), rank_on("m", {0, 1}), rank_on("m", {1, 0})}, 2).budget.cores, 2.0);
  // Ranks of other machines do not count, whatever their CPU numbers.
  const std::vector<RankCores> two_machines{rank_on("a", {0, 1}), rank_on("a", {0, 1}), rank_on("b", {0, 1, 2, 3}),
                                            rank_on("b", {0, 1, 2, 3}), rank_on("b", {0, 1, 2, 3})};
  EXPECT_EQ(shared_cores(two_machines, 1).ranks, 2);
  EXPECT_EQ(shared_cores(two_machines, 1).budget.cores, 2.0);
  EXPECT_EQ(shared_cores(two_machines, 4).ranks, 3);
  EXPECT_EQ(shared_cores(two_machines, 4).budget.cores, 4.0);
}

TEST(MachineCores, AddsTheQuotasOfSeparateCgroupsAndSharesOne) {
  // Two containers on a 2-CPU machine with 1 core each: a core per rank.
  const SharedCores containers = shared_cores({rank_on("m", {0, 1}, 1.0, "c1"), rank_on("m", {0, 1}, 1.0, "c2")}, 0);
  EXPECT_EQ(containers.ranks, 2);
  EXPECT_EQ(containers.budget.cores, 2.0) << containers.budget.why;
  // Half a core each: 1 core for the 2.
  const SharedCores halves = shared_cores({rank_on("m", {0, 1}, 0.5, "c1"), rank_on("m", {0, 1}, 0.5, "c2")}, 1);
  EXPECT_EQ(halves.budget.cores, 1.0);
  EXPECT_NE(halves.budget.why.find("quotas of their 2 cgroups: 1.00 cores"), std::string::npos) << halves.budget.why;
  // One quota shared by 3 ranks (a container holding a whole host's job).
  const SharedCores one = shared_cores({rank_on("m", {0, 1, 2, 3}, 1.5, "c"), rank_on("m", {0, 1, 2, 3}, 1.5, "c"),
                                        rank_on("m", {0, 1, 2, 3}, 1.5, "c")},
                                       2);
  EXPECT_EQ(one.ranks, 3);
  EXPECT_EQ(one.budget.cores, 1.5);
  EXPECT_EQ(choose_wait_mode(ProgressMode::kAuto, one.budget.cores, one.ranks).mode, WaitMode::kYield);
  // A rank with no quota may use every CPU: the machine's CPUs bound the
  // machine's ranks, and the rank with a quota stays within its own.
  const std::vector<RankCores> mixed{rank_on("m", {0, 1, 2}, 0.5, "c"), rank_on("m", {0, 1, 2})};
  EXPECT_EQ(shared_cores(mixed, 1).budget.cores, 3.0);
  EXPECT_EQ(shared_cores(mixed, 0).ranks, 1);
  EXPECT_EQ(shared_cores(mixed, 0).budget.cores, 0.5);
}

TEST(MachineCores, ACrowdedQuotaBindsItsRanksThoughTheMachineHasCoresToSpare) {
  // 16 CPUs; 2 ranks share 1 core's quota, a third has 8 of its own.
  std::vector<int> all(16);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<RankCores> ranks{rank_on("m", all, 1.0, "small"), rank_on("m", all, 1.0, "small"),
                                     rank_on("m", all, 8.0, "large")};
  const SharedCores crowded = shared_cores(ranks, 0);
  EXPECT_EQ(crowded.ranks, 2);
  EXPECT_EQ(crowded.budget.cores, 1.0);
  EXPECT_NE(crowded.budget.why.find("2 ranks share this process's quota of 1.00 cores"), std::string::npos)
      << crowded.budget.why;
  const SharedCores roomy = shared_cores(ranks, 2);
  EXPECT_EQ(roomy.ranks, 3);
  EXPECT_EQ(roomy.budget.cores, 9.0) << roomy.budget.why;
}

TEST(MachineCores, ADescriptionRoundTripsAndAMalformedOneIsAProtocolError) {
  const RankCores self = RankCores::self();
  EXPECT_FALSE(self.machine.empty());
  EXPECT_EQ(self.cpus, allowed_cpus());
  for (const RankCores& r : {self, rank_on("m", {}, 0.25, "7:42"), rank_on("boot", {3, 5})}) {
    const RankCores back = RankCores::decode(r.encode(), "rank 1");
    EXPECT_EQ(back.machine, r.machine);
    EXPECT_EQ(back.cpus, r.cpus);
    EXPECT_EQ(back.quota, r.quota);
    EXPECT_EQ(back.quota_cgroup, r.quota_cgroup);
  }
  for (const std::string& bad : {std::string(), std::string("[1,2]"), std::string("{\"machine\":\"m\"}"),
                                std::string("{\"machine\":\"m\",\"cpus\":[-1],\"quota\":null,\"quota_cgroup\":\"\"}"),
                                std::string("{\"machine\":\"m\",\"cpus\":[0],\"quota\":0,\"quota_cgroup\":\"\"}"),
                                rank_on("m", {0}).encode().substr(0, 20)}) {
    try {
      RankCores::decode(bad, "engine: rank 3");
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kProtocol) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 3 sent a malformed description of its cores"), std::string::npos)
          << e.what();
    }
  }
}

TEST(WaitPolicy, YieldsWhenRanksOutnumberCoresAndSpinsOtherwise) {
  const WaitChoice crowded = choose_wait_mode(ProgressMode::kAuto, 2, 3);
  EXPECT_EQ(crowded.mode, WaitMode::kYield);
  EXPECT_NE(crowded.why.find("3 ranks"), std::string::npos) << crowded.why;
  EXPECT_NE(crowded.why.find("2 cores"), std::string::npos) << crowded.why;
  EXPECT_EQ(choose_wait_mode(ProgressMode::kAuto, 2, 2).mode, WaitMode::kSpin);
  EXPECT_EQ(choose_wait_mode(ProgressMode::kAuto, 16, 8).mode, WaitMode::kSpin);
  EXPECT_EQ(choose_wait_mode(ProgressMode::kAuto, 1.5, 2).mode, WaitMode::kYield);  // a cgroup quota
  // DLOP_PROGRESS overrides the count.
  EXPECT_EQ(choose_wait_mode(ProgressMode::kSpin, 2, 8).mode, WaitMode::kSpin);
  EXPECT_EQ(choose_wait_mode(ProgressMode::kSleep, 2, 1).mode, WaitMode::kSleep);
  EXPECT_EQ(choose_wait_mode(ProgressMode::kYield, 16, 1).mode, WaitMode::kYield);
}

TEST(WaitPolicy, SpinsThatLoseTheirCoreSwitchToYield) {
  in_child([] {
    WaitPolicy& p = WaitPolicy::process();
    p.reset(ProgressMode::kAuto);
    // Spins on a core all the time, or too short to judge: no change.
    for (int i = 0; i < 20; ++i) p.report_spin(200us, 200us);
    for (int i = 0; i < 20; ++i) p.report_spin(10us, 1us);
    if (p.mode() != WaitMode::kSpin) return false;
    // A few lost among won: no change either.
    for (int i = 0; i < 20; ++i) p.report_spin(200us, i % 3 == 0 ? 20us : 200us);
    if (p.mode() != WaitMode::kSpin) return false;
    for (int i = 0; i < WaitPolicy::kLostToSwitch; ++i) p.report_spin(200us, 40us);
    if (p.mode() != WaitMode::kYield) return false;
    // A mode named by DLOP_PROGRESS stays.
    p.reset(ProgressMode::kSpin);
    for (int i = 0; i < 20; ++i) p.report_spin(200us, 1us);
    return p.mode() == WaitMode::kSpin;
  });
}

TEST(WaitPolicy, ASpinningWaitBesideBusyThreadsOnItsCoreSwitchesToYield) {
  in_child([] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(static_cast<int>(::sched_getcpu()), &one);
    if (::sched_setaffinity(0, sizeof(one), &one) != 0) return false;
    WaitPolicy::process().reset(ProgressMode::kAuto);
    std::atomic<bool> stop{false};
    std::vector<std::thread> busy;
    for (int i = 0; i < 3; ++i) {
      busy.emplace_back([&] {
        while (!stop.load(std::memory_order_relaxed)) cpu_relax();
      });
    }
    // Waits for something that never comes, each polling 5 ms: with three
    // busy threads on the one core, a spin gets about a quarter of its time.
    for (int i = 0; i < 4 * WaitPolicy::kWindow && WaitPolicy::process().mode() == WaitMode::kSpin; ++i) {
      Waiter w(ProgressMode::kAuto, 5ms);
      while (w.pause()) {
      }
    }
    stop = true;
    for (auto& t : busy) t.join();
    return WaitPolicy::process().mode() == WaitMode::kYield;
  });
}

TEST(WaitPolicy, EachModeBoundsItsPolling) {
  in_child([] {
    const auto polls_for = [](ProgressMode mode) {
      const auto start = Clock::now();
      Waiter w(mode, 2ms, 5ms);
      while (w.pause()) {
      }
      return Clock::now() - start;
    };
    WaitPolicy::process().reset(ProgressMode::kAuto);
    // Lower bounds only: the phase lasts at least its budget; it ended (no hang).
    return polls_for(ProgressMode::kSleep) < 2ms && polls_for(ProgressMode::kAuto) >= 2ms &&
           polls_for(ProgressMode::kYield) >= 5ms;
  });
}

}  // namespace
}  // namespace dlop
