// The engine: one per world communicator (and its splits). It owns the UCX
// worker and mesh, starts operations in submission order, progresses every
// running one, enforces their timeouts and completes their handles.
//
// With traffic classes on, running_ is kept in order of urgency (class, then
// a data op's deadline step, then start order): each pass progresses the
// most urgent first, and a chunked op (chunked_task.hpp) waits between
// chunks while a more urgent collective is in flight.
//
// Progress is driven by whoever holds the engine lock: the progress thread
// ("dlop-progress"), or a caller spinning in Handle::wait. The thread sleeps
// when nothing runs (no core burned while idle).
//
// A small blocking all-reduce on one host skips the queue when the engine is
// idle (inline_path.cpp): the caller runs it under the engine lock, without
// an allocation, and hands it over as a running op if its peers are late.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "collectives/registry.hpp"
#include "op_state.hpp"
#include "scheduler/data_credits.hpp"
#include "transport/bootstrap.hpp"
#include "transport/mesh.hpp"

namespace dlop::sched {

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  struct Scheduling {
    bool traffic_classes = true;
    std::size_t chunk_bytes = 8u << 20;
  };
  Engine(transport::Bootstrap& bootstrap, bool check_signatures, Scheduling scheduling);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  transport::Mesh& mesh() { return *mesh_; }
  // The bootstrap the engine was made with (it outlives the engine).
  transport::Bootstrap& bootstrap() { return *bootstrap_; }

  // Queues an operation; wakes the progress thread unless the caller will wait.
  void submit(std::shared_ptr<detail::OpState> op);
  // The fast path of a blocking all-reduce (options.caller_waits) that the
  // host arena's inline round serves: when this engine runs nothing, runs it
  // on the calling thread and returns its handle, done unless peers were late
  // (then the engine runs the rest). nullopt: not for the fast path now;
  // submit it. `args` must have passed the communicator's validation.
  std::optional<Handle> run_inline(const std::shared_ptr<CommState>& comm, const coll::CollArgs& args,
                                   const OpOptions& options, std::chrono::milliseconds default_timeout);
  // One progress pass on the calling thread if no one else is progressing.
  void try_progress();
  void wake_progress_thread();
  const std::shared_ptr<DataCredits>& data_credits() { return data_credits_; }

  // While one exists, a caller polls this engine itself (a blocking wait):
  // unless waits spin, the progress thread then leaves the core to it rather
  // than poll the same memory beside it.
  class Driver {
   public:
    explicit Driver(Engine* engine) : engine_(engine) {
      if (engine_ != nullptr) engine_->drivers_.fetch_add(1, std::memory_order_relaxed);
    }
    ~Driver() { stop(); }
    Driver(const Driver&) = delete;
    Driver& operator=(const Driver&) = delete;
    void stop() {
      if (engine_ != nullptr) engine_->drivers_.fetch_sub(1, std::memory_order_relaxed);
      engine_ = nullptr;
    }

   private:
    Engine* engine_;
  };

  // Communicator ids: each process hands out ids in increasing order.
  int next_comm_id() const { return next_comm_id_; }
  void reserve_comm_id(int id);

  // Fails the running and queued operations of one communicator.
  void abort(const std::shared_ptr<CommState>& comm, const std::string& reason);

 private:
  void thread_main();
  // Sleeps until a submitter (or, with_ucx, a UCX event) wakes it or the
  // timeout passes.
  void sleep_until_woken(int timeout_ms, bool with_ucx);
  // The same for a nap shorter than a millisecond (`nap` < 1 s), UCX not watched.
  void nap_until_woken(std::chrono::microseconds nap);
  // Under the engine lock: starts queued ops, progresses running ones, fails
  // timed-out ones. Finished ops are moved to `finished`. Returns whether any
  // op is still running.
  bool progress_locked(std::vector<std::shared_ptr<detail::OpState>>& finished);
  void start(const std::shared_ptr<detail::OpState>& op);
  // Starts gated ops from the front while their events are ready; fails one
  // past its deadline.
  void start_ready_gated(std::vector<std::shared_ptr<detail::OpState>>& finished);
  // Asks the front gated op's event to wake the progress thread when it passes.
  void ask_front_to_wake();
  std::unique_ptr<coll::Task> make_task(const std::shared_ptr<detail::OpState>& op, const coll::Algorithm& algorithm);
  // A gradient op whose task starts counts in the data credits until it finishes.
  void count_if_gradient(detail::OpState& op);
  // Inserts a started op into running_ at its place in the progress order.
  void add_running(std::shared_ptr<detail::OpState> op);
  // Whether a chunked op may begin its next chunk, given the collectives of
  // this pass still in flight ahead of it (more urgent or earlier).
  bool may_begin_chunk(detail::OpState& op, const std::vector<detail::OpState*>& in_flight,
                       std::chrono::steady_clock::time_point now);
  const coll::Algorithm& select(CommState& comm, const coll::CollArgs& args);
  // Mesh ranks the running op waits for: pending requests and its task's own.
  std::vector<int> awaited(const detail::OpState& op) const;
  void fail(detail::OpState& op, std::exception_ptr error);
  void finish_all(std::vector<std::shared_ptr<detail::OpState>>& finished);

  std::atomic<int> drivers_{0};
  transport::Bootstrap* bootstrap_;
  std::unique_ptr<transport::UcxWorker> worker_;
  std::unique_ptr<transport::Mesh> mesh_;
  coll::AlgorithmOverrides overrides_;
  bool check_signatures_;
  Scheduling scheduling_;
  std::shared_ptr<DataCredits> data_credits_ = std::make_shared<DataCredits>();  // shared with data movers
  std::uint64_t started_ops_ = 0;  // engine lock
  static constexpr unsigned kMemoryOnlyPasses = 16;
  unsigned memory_only_passes_ = 0;  // engine lock: passes that ran only shared-memory tasks
  std::vector<detail::OpState*> in_flight_;  // engine lock: scratch of progress_locked
  std::vector<std::shared_ptr<detail::OpState>> finished_;  // engine lock: try_progress's, empty between calls
  std::atomic<int> next_comm_id_{1};

  std::mutex engine_mutex_;  // the worker, the mesh, running_
  std::vector<std::shared_ptr<detail::OpState>> running_;
  // A member of the op's group the mesh found dead, or -1.
  int dead_member(const detail::OpState& op) const;

  std::mutex submit_mutex_;
  std::vector<std::shared_ptr<detail::OpState>> submitted_;
  std::vector<std::shared_ptr<detail::OpState>> starting_;  // engine lock: the batch being started
  // Engine lock: submitted ops waiting for their ReadyEvent, and every op
  // submitted after the first of them (ops start in submission order).
  std::deque<std::shared_ptr<detail::OpState>> gated_;
  std::atomic<bool> has_submitted_{false};

  int wake_fd_ = -1;  // eventfd the progress thread sleeps on
  // A copy of wake_fd_ for events that wake the engine from other threads:
  // closed when the last of them lets go, so a late one never writes to a
  // reused descriptor.
  std::shared_ptr<const int> wake_handle_;
  std::atomic<bool> stop_{false};
  // The world communicator (id 0) was aborted: no peer is owed our progress
  // any more, and a dead or silent one would hold the teardown's fence for
  // its whole deadline.
  std::atomic<bool> world_aborted_{false};
  std::thread thread_;
};

}  // namespace dlop::sched
