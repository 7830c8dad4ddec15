// Identity of processes and hosts, used to tell a dead peer from a slow one and
// ranks of one host from those of another.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace dlop {

// A process, identified by pid and kernel start time so that a recycled pid
// is not mistaken for the original process.
struct ProcessId {
  pid_t pid = 0;
  std::uint64_t start_time = 0;

  static ProcessId self();
  // True while that very process exists (a zombie counts as dead).
  bool alive() const;
  bool operator==(const ProcessId&) const = default;
};

// Identity of this machine (one kernel, whatever its namespaces): its boot
// id, else its hostname. Processes with equal identities share its cores.
std::string machine_identity();

// Identity of this host: DLOP_HOST_ID if set, else hostname, boot id and
// network namespace. Processes with equal identities use shared memory
// between them; others talk over the network. A process in another network
// namespace of the same kernel could still share memory, but it stands for a
// host of its own (containers, tests of several hosts on one machine).
std::string host_identity();

}  // namespace dlop
