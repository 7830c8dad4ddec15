#include "core/machine_cores.hpp"

#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/process.hpp"

namespace dlop {
namespace {

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

struct CgroupQuota {
  double cores = 0;
  std::filesystem::path file;  // for the log
  std::string cgroup;  // device:inode of the directory that sets it
};

std::string directory_id(const std::filesystem::path& dir) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return dir.string();
  return fmt::format("{}:{}", st.st_dev, st.st_ino);
}

// The tightest CPU quota on the way from this process's cgroup to the root.
std::optional<CgroupQuota> cgroup_quota() {
  std::ifstream in("/proc/self/cgroup");
  std::optional<CgroupQuota> tightest;
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
      if (cores && (!tightest || *cores < tightest->cores)) {
        tightest = CgroupQuota{*cores, dir / (v2 ? "cpu.max" : "cpu.cfs_quota_us"), directory_id(dir)};
      }
      if (p == p.root_path()) break;
    }
  }
  return tightest;
}

unsigned online_cpus() { return std::max(1u, std::thread::hardware_concurrency()); }

}  // namespace

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
    cpus.resize(online_cpus());
    std::iota(cpus.begin(), cpus.end(), 0);
    return cpus;
  }
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

RankCores RankCores::self() {
  RankCores me{.machine = machine_identity(), .cpus = allowed_cpus(), .quota = std::nullopt, .quota_cgroup = {}};
  if (const auto quota = cgroup_quota()) {
    me.quota = quota->cores;
    me.quota_cgroup = quota->cgroup;
  }
  return me;
}

std::string RankCores::encode() const {
  nlohmann::json j{{"machine", machine}, {"cpus", cpus}, {"quota", nullptr}, {"quota_cgroup", quota_cgroup}};
  if (quota) j["quota"] = *quota;
  return j.dump();
}

RankCores RankCores::decode(std::string_view text, std::string_view sender) {
  const auto malformed = [&](std::string_view what) {
    throw_error(Errc::kProtocol, fmt::format("{} sent a malformed description of its cores ({}): {:.200}", sender,
                                             what, text));
  };
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) malformed("not a JSON object");
  RankCores r;
  try {
    r.machine = j.at("machine").get<std::string>();
    r.cpus = j.at("cpus").get<std::vector<int>>();
    if (!j.at("quota").is_null()) r.quota = j.at("quota").get<double>();
    r.quota_cgroup = j.at("quota_cgroup").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    malformed(e.what());
  }
  if (r.machine.empty()) malformed("no machine");
  if (std::any_of(r.cpus.begin(), r.cpus.end(), [](int cpu) { return cpu < 0; })) malformed("a negative CPU");
  if (r.quota && !(*r.quota > 0)) malformed("a quota that is not positive");
  return r;
}

SharedCores shared_cores(const std::vector<RankCores>& ranks, std::size_t me) {
  const RankCores& mine = ranks.at(me);
  std::vector<int> cpus;
  std::map<std::string, double> quotas;  // the machine's cgroups with a quota
  bool unbounded = false;  // a rank of the machine has no quota
  int machine_ranks = 0;
  int cgroup_ranks = 0;
  for (const RankCores& r : ranks) {
    if (r.machine != mine.machine) continue;
    ++machine_ranks;
    cpus.insert(cpus.end(), r.cpus.begin(), r.cpus.end());
    if (r.quota) {
      quotas[r.quota_cgroup] = *r.quota;
      if (mine.quota && r.quota_cgroup == mine.quota_cgroup) ++cgroup_ranks;
    } else {
      unbounded = true;
    }
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  SharedCores machine{.ranks = machine_ranks,
                      .budget = {.cores = static_cast<double>(std::max<std::size_t>(1, cpus.size())),
                                 .why = fmt::format("affinity: the machine's {} ranks may run on {} of {} CPUs",
                                                    machine_ranks, cpus.size(), online_cpus())}};
  if (!unbounded && !quotas.empty()) {
    const double sum = std::accumulate(quotas.begin(), quotas.end(), 0.0,
                                       [](double s, const auto& q) { return s + q.second; });
    if (sum < machine.budget.cores) {
      machine.budget.cores = std::max(sum, 0.01);
      machine.budget.why += fmt::format(", capped by the quotas of their {} cgroups: {:.2f} cores", quotas.size(), sum);
    }
  }
  if (mine.quota) {
    const double quota = std::max(*mine.quota, 0.01);
    if (cgroup_ranks / quota > machine_ranks / machine.budget.cores) {
      return {.ranks = cgroup_ranks,
              .budget = {.cores = quota,
                         .why = fmt::format("cgroup quota: {} ranks share this process's quota of {:.2f} cores",
                                            cgroup_ranks, quota)}};
    }
  }
  return machine;
}

}  // namespace dlop
