#include "world_registry.hpp"

#include <mutex>

#include "core/log.hpp"
#include "work_dlop.hpp"

namespace dlop::backend {
namespace {

std::mutex registry_mutex;
std::weak_ptr<sched::Communicator> default_group;
std::weak_ptr<CompletionQueue> completion_queue;

}  // namespace

std::shared_ptr<sched::Communicator> make_group_communicator(transport::Bootstrap& bootstrap,
                                                             const std::vector<int>& global_ranks,
                                                             sched::Communicator::Options options) {
  std::lock_guard lock(registry_mutex);
  if (global_ranks.empty()) {
    auto comm = sched::Communicator::create(bootstrap, options);
    default_group = comm;
    return comm;
  }
  if (auto world = default_group.lock()) {
    bool inside = true;
    for (const int r : global_ranks) inside = inside && r >= 0 && r < world->size();
    if (inside) return world->subgroup(global_ranks, bootstrap);
  }
  log().info("process group of {} ranks has no live default dlop group: it starts an engine of its own",
             global_ranks.size());
  return sched::Communicator::create(bootstrap, options);
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
