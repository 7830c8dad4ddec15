#include "world_registry.hpp"

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/config.hpp"
#include "core/log.hpp"
#include "backend/work_dlop.hpp"

namespace dlop::backend {
namespace {

std::mutex registry_mutex;
std::weak_ptr<sched::Communicator> default_group;
std::weak_ptr<transport::Bootstrap> default_bootstrap;
std::weak_ptr<CompletionQueue> completion_queue;
std::weak_ptr<FaultChannel> fault_channel;

}  // namespace

// Shared by the channel and its poller.
struct FaultChannel::State {
  c10::intrusive_ptr<c10d::Store> store;  // the group's, for report()
  c10::intrusive_ptr<c10d::Store> polled;  // the poller's own connection where the store can clone one
  int rank = 0;
  std::string key;  // where reports go
  std::chrono::milliseconds every{200};
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  bool done = false;  // the poller has returned
  bool reported = false;
  std::vector<std::weak_ptr<sched::Communicator>> watched;

  void run() {
    pthread_setname_np(pthread_self(), "dlop-faults");
    std::unique_lock lock(mutex);
    while (!wake.wait_for(lock, every, [&] { return stop; })) {
      lock.unlock();
      std::string notice;
      bool failed = false;
      try {
        if (polled->check({key})) {
          const auto bytes = polled->get(key);
          notice.assign(bytes.begin(), bytes.end());
        }
      } catch (const std::exception& e) {
        // The store is gone (its host rank exited or died): nothing more to learn.
        log().debug("rank {}: fault channel stops polling: {}", rank, e.what());
        failed = true;
      }
      lock.lock();
      if (failed) break;
      if (notice.empty()) continue;
      auto comms = std::move(watched);
      watched.clear();
      lock.unlock();
      for (const auto& weak : comms) {
        if (auto comm = weak.lock()) comm->abort(notice);
      }
      lock.lock();
      break;
    }
    done = true;
  }
};

namespace {

// exit() joins the live channel's poller before static destructors run (the
// logger's among them): a process may exit without destroying its groups.
void stop_fault_channel_at_exit() {
  std::shared_ptr<FaultChannel> channel;
  {
    std::lock_guard lock(registry_mutex);
    channel = fault_channel.lock();
  }
  if (channel) channel->stop();
}

}  // namespace

FaultChannel::FaultChannel(c10::intrusive_ptr<c10d::Store> store, int rank, std::string key)
    : state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->rank = rank;
  state_->key = std::move(key);
  state_->every = std::max(config().watchdog, std::chrono::milliseconds(100)) * 2;
  try {
    state_->polled = state_->store->clone();
  } catch (const std::exception& e) {  // a store without clone(): the poller shares the group's
    log().debug("rank {}: fault channel polls the group's own store connection: {}", rank, e.what());
    state_->polled = state_->store;
  }
  poller_ = std::thread([state = state_] { state->run(); });
}

FaultChannel::~FaultChannel() { stop(); }

void FaultChannel::stop() {
  std::lock_guard joining(stop_mutex_);
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  if (poller_.joinable()) poller_.join();
}

void FaultChannel::report(const std::string& what) {
  {
    std::lock_guard lock(state_->mutex);
    if (state_->reported) return;
    state_->reported = true;
  }
  const std::string notice = fmt::format("rank {} reported a dead peer: {}", state_->rank, what);
  try {
    state_->store->set(state_->key, std::vector<std::uint8_t>(notice.begin(), notice.end()));
  } catch (const std::exception& e) {
    log().debug("rank {}: could not report a dead peer through the store: {}", state_->rank, e.what());
  }
}

void FaultChannel::watch(const std::shared_ptr<sched::Communicator>& comm) {
  std::lock_guard lock(state_->mutex);
  if (!state_->done) state_->watched.push_back(comm);
}

std::shared_ptr<FaultChannel> group_fault_channel(const c10::intrusive_ptr<c10d::Store>& default_store, int rank,
                                                  const std::string& key) {
  std::lock_guard lock(registry_mutex);
  if (default_store) {
    static const bool registered = std::atexit(stop_fault_channel_at_exit) == 0;
    if (!registered) log().warn("rank {}: could not register the fault channel's exit hook", rank);
    auto channel = std::make_shared<FaultChannel>(default_store, rank, key);
    fault_channel = channel;
    return channel;
  }
  return fault_channel.lock();
}

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
