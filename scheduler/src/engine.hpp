// The engine: one per world communicator (and its splits). It owns the UCX
// worker and mesh, starts operations in submission order, progresses every
// running one, enforces their timeouts and completes their handles.
//
// Progress is driven by whoever holds the engine lock: the progress thread
// ("dlop-progress"), or a caller spinning in Handle::wait. The thread sleeps
// when nothing runs (no core burned while idle).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/registry.hpp"
#include "op_state.hpp"
#include "transport/bootstrap.hpp"
#include "transport/mesh.hpp"

namespace dlop::sched {

class Engine {
 public:
  Engine(transport::Bootstrap& bootstrap, bool check_signatures);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  transport::Mesh& mesh() { return *mesh_; }
  // The bootstrap the engine was made with (it outlives the engine).
  transport::Bootstrap& bootstrap() { return *bootstrap_; }

  // Queues an operation; wakes the progress thread unless the caller will wait.
  void submit(std::shared_ptr<detail::OpState> op);
  // One progress pass on the calling thread if no one else is progressing.
  void try_progress();
  void wake_progress_thread();

  // Communicator ids: each process hands out ids in increasing order.
  int next_comm_id() const { return next_comm_id_; }
  void reserve_comm_id(int id);

  // Fails the running and queued operations of one communicator.
  void abort(const std::shared_ptr<CommState>& comm, const std::string& reason);

 private:
  void thread_main();
  void sleep_until_woken(int timeout_ms, bool with_ucx);
  // Under the engine lock: starts queued ops, progresses running ones, fails
  // timed-out ones. Finished ops are moved to `finished`. Returns whether any
  // op is still running.
  bool progress_locked(std::vector<std::shared_ptr<detail::OpState>>& finished);
  void start(const std::shared_ptr<detail::OpState>& op);
  const coll::Algorithm& select(detail::OpState& op);
  // Mesh ranks the running op waits for: pending requests and its task's own.
  std::vector<int> awaited(const detail::OpState& op) const;
  void fail(detail::OpState& op, std::exception_ptr error);
  static void finish_all(std::vector<std::shared_ptr<detail::OpState>>& finished);

  transport::Bootstrap* bootstrap_;
  std::unique_ptr<transport::UcxWorker> worker_;
  std::unique_ptr<transport::Mesh> mesh_;
  coll::AlgorithmOverrides overrides_;
  bool check_signatures_;
  std::atomic<int> next_comm_id_{1};

  std::mutex engine_mutex_;  // the worker, the mesh, running_
  std::vector<std::shared_ptr<detail::OpState>> running_;
  // A member of the op's group the mesh found dead, or -1.
  int dead_member(const detail::OpState& op) const;

  std::mutex submit_mutex_;
  std::vector<std::shared_ptr<detail::OpState>> submitted_;
  std::vector<std::shared_ptr<detail::OpState>> starting_;  // engine lock: the batch being started
  std::atomic<bool> has_submitted_{false};

  int wake_fd_ = -1;  // eventfd the progress thread sleeps on
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dlop::sched
