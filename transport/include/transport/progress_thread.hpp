// A named thread that progresses one UcxWorker whenever it has events, so
// that transfers land while the thread that posted them does something else
// (offload's trainer computing while a batch arrives over UCX).
//
// The worker is in serialized mode: every other thread's UCX call on it
// (posting, canceling, reading a request's state, destroying one) holds
// lock(), which the thread holds while it progresses. The owner of the
// ProgressThread joins it on destruction.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "transport/ucx_worker.hpp"

namespace dlop::transport {

class ProgressThread {
 public:
  // Starts the thread (named `name`, at most 15 characters) over `worker`.
  explicit ProgressThread(std::shared_ptr<UcxWorker> worker, const std::string& name = "dlop-ucx");
  ~ProgressThread();  // stops and joins
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  std::unique_lock<std::recursive_mutex> lock() { return std::unique_lock(mutex_); }
  UcxWorker& worker() { return *worker_; }
  const std::shared_ptr<UcxWorker>& worker_ptr() const { return worker_; }

  // Readable once a progress pass did something since the last
  // drain_activity(): poll it to wake when a transfer may have finished.
  int activity_fd() const { return activity_fd_; }
  void drain_activity();
  // Progress passes that did something, so far.
  std::uint64_t active_passes() const { return active_passes_.load(std::memory_order_relaxed); }

  // Work that must happen on this thread between progress passes, with
  // lock() held (offload posting receives it deferred for pacing). A hook
  // returns how soon it wants to look again while it waits for something
  // with no UCX event of its own (the thread looks within that, rounded up
  // to 1 ms, and within 10 ms anyway), or nullopt. One hook per key; remove
  // it (under no other lock of the owner's) before the owner dies.
  using PassHook = std::function<std::optional<std::chrono::microseconds>()>;
  void set_hook(const void* key, PassHook hook);
  void remove_hook(const void* key);
  // Runs a pass soon, from any thread: what a hook waits for has happened.
  void wake();

 private:
  void run();

  std::shared_ptr<UcxWorker> worker_;
  std::recursive_mutex mutex_;
  int stop_fd_ = -1;      // eventfd: written to stop the thread
  int wake_fd_ = -1;      // eventfd: written by wake()
  int activity_fd_ = -1;  // eventfd: written after an active pass
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> active_passes_{0};
  std::map<const void*, PassHook> hooks_;  // under mutex_
  std::thread thread_;
};

}  // namespace dlop::transport
