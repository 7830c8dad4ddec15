// WorkDlop: the c10d::Work of one ProcessGroupDlop call, made of one or more
// engine handles (a coalesced call submits several).
//
// Completion (copying staged results back, marking the future) never runs on
// the engine's thread: DDP's and users' future callbacks run inline when the
// future completes, and one that waits on another collective would block the
// engine that has to progress it. So the last handle to finish queues the
// Work on the process's CompletionQueue, or a caller blocked in wait()
// completes it first itself (lower latency, no thread hand-off).
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "scheduler/handle.hpp"

namespace dlop::backend {

class FaultChannel;
class WorkDlop;

// A future callback may itself wait on another collective's future (PowerSGD's
// hook does), and that future is completed by this queue too: a thread is
// added whenever queued Works outnumber the idle threads, so a callback that
// blocks never holds up the completion it waits for.
class CompletionQueue {
 public:
  CompletionQueue();
  ~CompletionQueue();  // completes what is queued, then joins
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;
  void push(c10::intrusive_ptr<WorkDlop> work);

 private:
  static constexpr size_t kMaxThreads = 64;  // nesting deeper than this waits
  void run();
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<c10::intrusive_ptr<WorkDlop>> queue_;
  bool stop_ = false;
  size_t idle_ = 0;  // threads waiting for work
  std::vector<std::thread> threads_;
};

class WorkDlop : public c10d::Work {
 public:
  WorkDlop(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive,
           std::function<void()> finish);
  // Hooks the handles up; call once, right after construction.
  void attach(std::vector<sched::Handle> handles, const std::shared_ptr<CompletionQueue>& queue);
  // Instead of attach, for a caller that waits at once (async_op=False):
  // waits for the handles on the calling thread and completes the Work before
  // it is returned, so no completion callback is registered and nothing is
  // handed to another thread. If a wait gives up while its operation still
  // runs (the engine stuck past the operation's deadline), the Work is
  // attached instead and completes when the operation does.
  void complete_in_place(std::vector<sched::Handle> handles, const std::shared_ptr<CompletionQueue>& queue);
  // A handle that fails because a peer died tells the job through `faults`.
  void report_peer_deaths_to(const std::shared_ptr<FaultChannel>& faults) { faults_ = faults; }

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override;

  // Finishes the Work once: error or copy-back, then the future. Idempotent.
  void complete();

 private:
  std::vector<sched::Handle> handles_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_alive_;
  std::function<void()> finish_;
  std::weak_ptr<FaultChannel> faults_;
  // The future is made on the first getFuture() (nobody asks a blocking
  // call's Work for one) and completed by complete(), or by getFuture() if
  // complete() ran first.
  void settle(c10::ivalue::Future& future) const;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // future_mutex_
  bool finished_ = false;                           // future_mutex_: complete() has run
  std::exception_ptr error_;                        // the Work's error, fixed once finished_
  std::atomic<bool> succeeded_{false};  // complete() ran, without error (wait's fast path)
  std::atomic<int> remaining_{0};
  std::atomic<bool> completing_{false};
  // A caller blocked in wait() claims the completion (kCallerWaiting); the last
  // handle to finish then leaves it to that caller (kCallerCompletes) instead
  // of waking the completion thread, so a blocking call costs no thread
  // wake-up (measured: a futex wake and a context switch per call, which on a
  // busy machine steal the core the peer rank needs).
  enum : int { kNoWaiter, kCallerWaiting, kCallerCompletes };
  std::atomic<int> waiter_{kNoWaiter};
};

// Blocking torch calls (async_op=False) wait at once: the caller's thread
// drives the engine instead of waking the progress thread, and the Work is
// complete when returned. asyncOp is missing from older torch headers.
bool in_device_scope();  // the host half of a staged device call: its Work waits (device_staging.hpp)
template <class Options>
bool caller_waits(const Options& opts) {
  if (in_device_scope()) return false;
  if constexpr (requires { opts.asyncOp; }) {
    return !opts.asyncOp;
  } else {
    return false;
  }
}

// The torch exception for an exception dlop threw (torch_error for a
// dlop::Error; c10 errors pass unchanged).
std::exception_ptr to_torch_error(std::exception_ptr error);

}  // namespace dlop::backend

namespace dlop::backend {

// Runs f, turning a dlop::Error it throws (an argument the engine refused
// before sending anything) into the matching torch exception.
template <class F>
decltype(auto) torch_errors(F&& f) {
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception&) {
    std::rethrow_exception(to_torch_error(std::current_exception()));
  }
}

}  // namespace dlop::backend
