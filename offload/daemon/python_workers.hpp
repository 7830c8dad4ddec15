// The generic Python path of one connection: --threads Python processes
// (python -m dlop.data._python_worker) that load the client's pickled Dataset
// and collate_fn and make batches as blobs (dlop.data._python_job), each
// driven by a thread of its own here. The wire to a worker is described in
// python/dlop/data/_python_worker.py. The processes are killed with the
// connection: nothing of them outlives it.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "executor.hpp"
#include "transport/socket.hpp"

namespace dlop::offload::daemon {

class PythonWorkers {
 public:
  // Starts `count` workers with `python` and gives each the job, without
  // waiting for them: loading (importing torch, unpickling the dataset) takes
  // seconds, and the daemon's event loop serves other clients meanwhile.
  // The first worker's answer decides: load_state() leaves kLoading within
  // two minutes, and `wake` is called when it does.
  PythonWorkers(const std::string& python, std::size_t count, const protocol::Bytes& job, DaemonStats& stats,
                std::function<void(JobResult)> deliver, std::function<void()> wake);
  ~PythonWorkers();  // kills the workers; results not yet delivered are dropped
  PythonWorkers(const PythonWorkers&) = delete;
  PythonWorkers& operator=(const PythonWorkers&) = delete;

  enum class LoadState { kLoading, kLoaded, kFailed };
  LoadState load_state() const;
  std::string load_error() const;   // kFailed: why, with the worker's own reason
  std::uint64_t dataset_size() const;  // kLoaded: the dataset's length
  void submit(Job job);
  bool cancel_queued(std::uint64_t lease);

 private:
  struct Worker {
    pid_t pid = -1;
    transport::net::UniqueFd fd;
    std::thread thread;
  };
  void start(const std::string& python, const protocol::Bytes& job);
  // Reads a worker's answer to the job; throws WorkerGone when it failed.
  std::uint64_t await_load(Worker& w);
  void serve(Worker& w, bool first);
  JobResult execute(Worker& w, Job job, bool& died);

  DaemonStats& stats_;
  std::function<void(JobResult)> deliver_;
  std::function<void()> wake_;
  std::string python_;
  std::shared_ptr<SpareBuffers> spare_ = std::make_shared<SpareBuffers>();
  std::uint64_t dataset_size_ = 0;  // guarded by mutex_, as the two below
  LoadState load_state_ = LoadState::kLoading;
  std::string load_error_;
  std::vector<Worker> workers_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::size_t alive_ = 0;  // workers still serving
  bool stop_ = false;
};

// The interpreter for the workers: DLOP_OFFLOADER_PYTHON, else python3 next
// to this executable (a venv's bin/), else python3 on PATH.
std::string default_python();

}  // namespace dlop::offload::daemon
