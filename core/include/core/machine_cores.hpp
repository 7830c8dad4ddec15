// The cores a rank may use, and the cores the ranks of one machine share.
//
// A machine is one kernel: its boot id. Network namespaces, containers and
// DLOP_HOST_ID make separate hosts for the transport, but their processes
// still run on the same cores, so the wait policy counts them together. A
// cgroup CPU quota bounds the ranks inside it: containers with quotas of
// their own add up, ranks inside one quota share it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlop {

// A number of cores; `why` says where it came from, for the log.
struct CoreBudget {
  double cores = 1;
  std::string why;
};

// The CPU numbers this process may run on (its affinity).
std::vector<int> allowed_cpus();
// A cgroup v2 cpu.max ("QUOTA PERIOD" or "max PERIOD") as cores; nullopt: no quota.
std::optional<double> parse_cgroup_cpu_max(std::string_view text);

// What one rank tells the others about the cores it runs on.
struct RankCores {
  std::string machine;  // boot id (hostname where it cannot be read)
  std::vector<int> cpus;  // allowed_cpus()
  std::optional<double> quota;  // the tightest cgroup CPU quota above it, in cores
  std::string quota_cgroup;  // the cgroup that sets `quota` (device:inode, equal across cgroup namespaces)

  static RankCores self();
  std::string encode() const;
  // Throws Errc::kProtocol naming `sender` when `text` is not what encode() writes.
  static RankCores decode(std::string_view text, std::string_view sender);
};

// The ranks the waits of ranks[me] compete with, and the cores they share:
// the tighter of (every rank of its machine, on every CPU one of them may
// run on, capped by the sum of their cgroups' quotas) and (the ranks inside
// its own cgroup quota, on that quota).
struct SharedCores {
  int ranks = 1;
  CoreBudget budget;
};
SharedCores shared_cores(const std::vector<RankCores>& ranks, std::size_t me);

}  // namespace dlop
