#include "core/wait_policy.hpp"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <numeric>
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

std::string read_first_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::optional<long long> parse_integer(std::string_view text) {
  long long v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// The tightest CPU quota on the way from this process's cgroup to the root.
std::optional<double> cgroup_quota(std::string& where) {
  std::ifstream in("/proc/self/cgroup");
  std::optional<double> tightest;
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find(':');
    const auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::filesystem::path path = line.substr(second + 1);
    const bool v2 = controllers.empty();
    const bool v1_cpu = ("," + controllers + ",").find(",cpu,") != std::string::npos;
    if (!v2 && !v1_cpu) continue;
    const std::filesystem::path root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/cpu";
    for (std::filesystem::path p = path; !p.empty(); p = p.has_relative_path() ? p.parent_path() : std::filesystem::path()) {
      const auto dir = root / p.relative_path();
      std::optional<double> cores;
      if (v2) {
        cores = parse_cgroup_cpu_max(read_first_line(dir / "cpu.max"));
      } else {
        const auto quota = parse_integer(read_first_line(dir / "cpu.cfs_quota_us"));
        const auto period = parse_integer(read_first_line(dir / "cpu.cfs_period_us"));
        if (quota && period && *quota > 0 && *period > 0) cores = static_cast<double>(*quota) / static_cast<double>(*period);
      }
      if (cores && (!tightest || *cores < *tightest)) {
        tightest = cores;
        where = (dir / (v2 ? "cpu.max" : "cpu.cfs_quota_us")).string();
      }
      if (p == p.root_path()) break;
    }
  }
  return tightest;
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

std::optional<double> parse_cgroup_cpu_max(std::string_view text) {
  const auto space = text.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const auto quota = parse_integer(text.substr(0, space));
  const auto period = parse_integer(text.substr(space + 1));
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;  // "max", or unreadable
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) {
    cpus.resize(std::max(1u, std::thread::hardware_concurrency()));
    std::iota(cpus.begin(), cpus.end(), 0);
    return cpus;
  }
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

namespace {

CoreBudget capped_by_quota(CoreBudget budget) {
  std::string where;
  if (const auto quota = cgroup_quota(where); quota && *quota < budget.cores) {
    budget.cores = std::max(*quota, 0.01);
    budget.why += fmt::format(", cgroup quota {:.2f} cores ({})", *quota, where);
  }
  return budget;
}

}  // namespace

CoreBudget usable_cores() {
  const unsigned online = std::max(1u, std::thread::hardware_concurrency());
  const auto allowed = allowed_cpus().size();
  return capped_by_quota({.cores = static_cast<double>(std::max<std::size_t>(1, allowed)),
                          .why = fmt::format("affinity: {} of {} CPUs", allowed, online)});
}

CoreBudget usable_cores(const std::vector<std::vector<int>>& allowed_per_rank) {
  std::vector<int> any;
  for (const auto& cpus : allowed_per_rank) any.insert(any.end(), cpus.begin(), cpus.end());
  std::sort(any.begin(), any.end());
  any.erase(std::unique(any.begin(), any.end()), any.end());
  const unsigned online = std::max(1u, std::thread::hardware_concurrency());
  return capped_by_quota({.cores = static_cast<double>(std::max<std::size_t>(1, any.size())),
                          .why = fmt::format("affinity: the host's {} ranks may run on {} of {} CPUs",
                                             allowed_per_rank.size(), any.size(), online)});
}

WaitChoice choose_wait_mode(ProgressMode requested, double cores, int local_ranks) {
  switch (requested) {
    case ProgressMode::kSpin: return {WaitMode::kSpin, "DLOP_PROGRESS=spin"};
    case ProgressMode::kYield: return {WaitMode::kYield, "DLOP_PROGRESS=yield"};
    case ProgressMode::kSleep: return {WaitMode::kSleep, "DLOP_PROGRESS=sleep"};
    case ProgressMode::kAuto: break;
  }
  if (static_cast<double>(local_ranks) > cores) {
    return {WaitMode::kYield, fmt::format("{} ranks on this host share {:g} cores: a waiting rank gives its core "
                                          "to the one it waits for",
                                          local_ranks, cores)};
  }
  return {WaitMode::kSpin, fmt::format("{} ranks on this host, {:g} cores: a core each, so waits spin briefly",
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
