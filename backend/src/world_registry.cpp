#include "world_registry.hpp"

#include <mutex>

#include "core/log.hpp"
#include "work_dlop.hpp"

namespace dlop::backend {
namespace {

std::mutex registry_mutex;
std::weak_ptr<sched::Communicator> default_group;
std::weak_ptr<transport::Bootstrap> default_bootstrap;
std::weak_ptr<CompletionQueue> completion_queue;

}  // namespace

GroupCommunicator make_group_communicator(const std::shared_ptr<transport::Bootstrap>& bootstrap,
                                          const std::vector<int>& global_ranks,
                                          sched::Communicator::Options options) {
  std::lock_guard lock(registry_mutex);
  if (global_ranks.empty()) {
    auto comm = sched::Communicator::create(*bootstrap, options);
    default_group = comm;
    default_bootstrap = bootstrap;
    return {comm, bootstrap};
  }
  auto world = default_group.lock();
  auto world_bootstrap = default_bootstrap.lock();
  if (world && world_bootstrap) {
    bool inside = true;
    for (const int r : global_ranks) inside = inside && r >= 0 && r < world->size();
    if (inside) return {world->subgroup(global_ranks, *bootstrap), world_bootstrap};
  }
  log().info("process group of {} ranks has no live default dlop group: it starts an engine of its own",
             global_ranks.size());
  return {sched::Communicator::create(*bootstrap, options), bootstrap};
}

std::shared_ptr<CompletionQueue> shared_completion_queue() {
  std::lock_guard lock(registry_mutex);
  auto queue = completion_queue.lock();
  if (!queue) {
    queue = std::make_shared<CompletionQueue>();
    completion_queue = queue;
  }
  return queue;
}

}  // namespace dlop::backend
