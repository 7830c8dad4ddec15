#include "core/wait_policy.hpp"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <bit>
#include <thread>

#include <fmt/format.h>

#include "core/log.hpp"

namespace dlop {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::nanoseconds thread_cpu_time() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

}  // namespace

std::string_view wait_mode_name(WaitMode mode) {
  switch (mode) {
    case WaitMode::kSpin: return "spin";
    case WaitMode::kYield: return "yield";
    case WaitMode::kSleep: return "sleep";
  }
  return "?";
}

WaitChoice choose_wait_mode(ProgressMode requested, double cores, int local_ranks) {
  switch (requested) {
    case ProgressMode::kSpin: return {WaitMode::kSpin, "DLOP_PROGRESS=spin"};
    case ProgressMode::kYield: return {WaitMode::kYield, "DLOP_PROGRESS=yield"};
    case ProgressMode::kSleep: return {WaitMode::kSleep, "DLOP_PROGRESS=sleep"};
    case ProgressMode::kAuto: break;
  }
  if (static_cast<double>(local_ranks) > cores) {
    return {WaitMode::kYield, fmt::format("{} ranks share {:g} core{}: a waiting rank gives its core "
                                          "to the one it waits for",
                                          local_ranks, cores, cores == 1 ? "" : "s")};
  }
  return {WaitMode::kSpin, fmt::format("{} ranks, {:g} cores: a core each, so waits spin briefly",
                                       local_ranks, cores)};
}

WaitPolicy::WaitPolicy() { reset(config().progress); }

WaitPolicy& WaitPolicy::process() {
  static WaitPolicy policy;
  return policy;
}

void WaitPolicy::reset(ProgressMode requested) {
  automatic_.store(requested == ProgressMode::kAuto);
  mode_.store(choose_wait_mode(requested, 1, 1).mode);
  history_.store(0);
  judged_.store(0);
}

void WaitPolicy::set(WaitMode mode, const std::string& why) {
  const WaitMode before = mode_.exchange(mode);
  static std::atomic<bool> logged{false};
  if (before != mode || !logged.exchange(true)) log().info("wait policy: {} ({})", wait_mode_name(mode), why);
}

void WaitPolicy::decide(int local_ranks, const CoreBudget& budget) {
  const WaitChoice choice = choose_wait_mode(config().progress, budget.cores, local_ranks);
  set(choice.mode, choice.why + "; " + budget.why);
  history_.store(0);
  judged_.store(0);
}

void WaitPolicy::report_spin(std::chrono::nanoseconds wall, std::chrono::nanoseconds on_cpu) {
  if (!automatic_.load(std::memory_order_relaxed) || mode() != WaitMode::kSpin || wall < kJudgedSpin) return;
  const std::uint32_t lost = on_cpu * 2 < wall ? 1 : 0;
  std::uint32_t history = history_.load(std::memory_order_relaxed);
  constexpr std::uint32_t kMask = (1u << kWindow) - 1;
  while (!history_.compare_exchange_weak(history, ((history << 1) | lost) & kMask, std::memory_order_relaxed)) {
  }
  history = ((history << 1) | lost) & kMask;
  const int judged = judged_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (judged >= kWindow && std::popcount(history) >= kLostToSwitch) {
    set(WaitMode::kYield, fmt::format("spinning waits lost their core: {} of the last {} were on a core less than "
                                      "half of their spin",
                                      std::popcount(history), kWindow));
  }
}

Waiter::Waiter(ProgressMode requested, std::chrono::microseconds spin, std::chrono::microseconds yield)
    : mode_(requested == ProgressMode::kAuto ? WaitPolicy::process().mode() : choose_wait_mode(requested, 1, 1).mode),
      spin_whole_wait_(requested == ProgressMode::kSpin),
      budget_(mode_ == WaitMode::kSpin ? spin : yield) {
  if (mode_ == WaitMode::kSleep) polling_ = false;
}

Waiter::~Waiter() {
  if (mode_ == WaitMode::kSpin && polling_ && start_ != Clock::time_point{}) {
    WaitPolicy::process().report_spin(Clock::now() - start_, thread_cpu_time() - cpu_start_);
  }
}

void Waiter::start(Clock::time_point now) {
  start_ = now;
  poll_until_ = spin_whole_wait_ ? Clock::time_point::max() : now + budget_;
  if (mode_ == WaitMode::kSpin) cpu_start_ = thread_cpu_time();
}

bool Waiter::pause() {
  if (!polling_) return false;
  ++rounds_;
  if (mode_ == WaitMode::kSpin) {
    cpu_relax();
    if ((rounds_ & 63u) != 0) return true;  // read the clock only every few rounds
  } else {
    ::sched_yield();
    if ((rounds_ & 3u) != 0) return true;
  }
  const auto now = Clock::now();
  if (start_ == Clock::time_point{}) {
    start(now);
    return true;
  }
  if (now < poll_until_) return true;
  polling_ = false;
  if (mode_ == WaitMode::kSpin) WaitPolicy::process().report_spin(now - start_, thread_cpu_time() - cpu_start_);
  return false;
}

void Waiter::sleep_a_little() {
  std::this_thread::sleep_for(sleep_);
  sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
}

}  // namespace dlop
