// What the process groups of one process share: one engine (the default
// group's, which sub-groups join through Communicator::subgroup) and one
// completion thread.
#pragma once

#include <memory>
#include <vector>

#include "scheduler/communicator.hpp"

namespace dlop::backend {

class CompletionQueue;

// The communicator for a new group. global_ranks empty: the default group,
// which starts the process's engine. Otherwise the group's ranks in the
// default group: a sub-communicator of the live default group's engine, or
// (no live default group of dlop) an engine of its own.
// The engine keeps a reference to the bootstrap it was created with: a group
// holds engine_bootstrap for as long as it holds the communicator.
struct GroupCommunicator {
  std::shared_ptr<sched::Communicator> comm;
  std::shared_ptr<transport::Bootstrap> engine_bootstrap;
};
GroupCommunicator make_group_communicator(const std::shared_ptr<transport::Bootstrap>& bootstrap,
                                          const std::vector<int>& global_ranks,
                                          sched::Communicator::Options options);

// The process's completion thread, started with the first group and joined
// when the last one lets go of it.
std::shared_ptr<CompletionQueue> shared_completion_queue();

}  // namespace dlop::backend
