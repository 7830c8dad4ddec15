#include "backend/work_dlop.hpp"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include "backend/torch_error.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "world_registry.hpp"

namespace dlop::backend {

std::exception_ptr torch_error(Errc code, std::string message, c10::SourceLocation where) {
  if (code == Errc::kInvalidArgument) {
    return std::make_exception_ptr(CodedTorchError<c10::ValueError>(code, std::move(message), where));
  }
  return std::make_exception_ptr(CodedTorchError<c10::DistBackendError>(code, std::move(message), where));
}

std::exception_ptr to_torch_error(std::exception_ptr error) {
  if (!error) return nullptr;
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error&) {
    return error;
  } catch (const Error& e) {
    // Callers written for Gloo match " Timed out " in the message.
    return torch_error(e.code(), e.code() == Errc::kTimeout ? fmt::format("dlop: Timed out ({})", e.what()) : e.what());
  } catch (const std::exception& e) {
    try {
      C10_THROW_ERROR(DistBackendError, std::string("dlop: ") + e.what());
    } catch (...) {
      return std::current_exception();
    }
  }
  return error;
}

CompletionQueue::CompletionQueue() {
  std::lock_guard lock(mutex_);
  threads_.emplace_back([this] { run(); });
}

CompletionQueue::~CompletionQueue() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  // No push can come any more (pushers hold the queue alive), so threads_ is stable.
  for (auto& thread : threads_) thread.join();
}

void CompletionQueue::push(c10::intrusive_ptr<WorkDlop> work) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(work));
    if (queue_.size() > idle_ && threads_.size() < kMaxThreads) threads_.emplace_back([this] { run(); });
  }
  wake_.notify_one();
}

void CompletionQueue::run() {
  pthread_setname_np(pthread_self(), "dlop-complete");
  std::unique_lock lock(mutex_);
  for (;;) {
    ++idle_;
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) return;  // stop_ and drained
    auto work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    work->complete();
    work.reset();  // drop the tensors outside the lock
    lock.lock();
  }
}

WorkDlop::WorkDlop(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive,
                   std::function<void()> finish)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      keep_alive_(std::move(keep_alive)),
      finish_(std::move(finish)) {}

void WorkDlop::attach(std::vector<sched::Handle> handles, const std::shared_ptr<CompletionQueue>& queue) {
  handles_ = std::move(handles);
  remaining_.store(static_cast<int>(handles_.size()) + 1);  // +1: attach itself
  auto self = c10::intrusive_ptr<WorkDlop>::reclaim_copy(this);
  // Weak: the queue belongs to the process groups; once they are gone (shut
  // down), the last handle completes the Work on its own thread.
  auto on_done = [self, weak_queue = std::weak_ptr<CompletionQueue>(queue)](std::exception_ptr) {
    if (self->remaining_.fetch_sub(1) != 1) return;
    int waiting = kCallerWaiting;
    if (self->waiter_.compare_exchange_strong(waiting, kCallerCompletes)) return;  // wait() completes it
    if (auto live = weak_queue.lock()) {
      live->push(self);
    } else {
      self->complete();
    }
  };
  for (const auto& handle : handles_) handle.on_complete(on_done);
  on_done(nullptr);
}

void WorkDlop::complete_in_place(std::vector<sched::Handle> handles, const std::shared_ptr<CompletionQueue>& queue) {
  for (const auto& handle : handles) {
    try {
      handle.wait();
    } catch (...) {
      // A failed operation is done: complete() reports its error.
      if (!handle.test()) {
        attach(std::move(handles), queue);
        return;
      }
    }
  }
  handles_ = std::move(handles);
  complete();
}

bool WorkDlop::isCompleted() {
  if (!c10d::Work::isCompleted()) {
    bool all_done = true;
    for (const auto& handle : handles_) all_done = handle.test() && all_done;
    if (all_done) complete();
  }
  return c10d::Work::isCompleted();
}

bool WorkDlop::wait(std::chrono::milliseconds timeout) {
  // What torch's wait would find for a CPU Work that succeeded (it has nothing
  // to synchronise), without its two mutex round trips: the common case after
  // complete_in_place.
  if (succeeded_.load(std::memory_order_acquire)) return true;
  if (c10d::Work::isCompleted()) return c10d::Work::wait(timeout);  // failed, or done before
  const bool bounded = timeout != kNoTimeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int no_waiter = kNoWaiter;
  const bool claimed = waiter_.compare_exchange_strong(no_waiter, kCallerWaiting);
  for (const auto& handle : handles_) {
    try {
      if (!bounded) {
        handle.wait();
        continue;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      handle.wait(std::max(left, std::chrono::milliseconds(0)));
    } catch (const Error& e) {
      // A wait that ran out of the caller's time leaves the operation running;
      // one that failed is completed below and rethrown by Work::wait.
      // Before giving up, hand the completion back to the queue, unless the
      // last handle has just left it to this caller (then all are done).
      int waiting = kCallerWaiting;
      if (e.code() == Errc::kTimeout && !handle.test() &&
          (!claimed || waiter_.compare_exchange_strong(waiting, kNoWaiter))) {
        std::rethrow_exception(torch_error(Errc::kTimeout, fmt::format("dlop: Work.wait timed out after {} ms waiting for {}",
                                                                       timeout.count(), handle.describe())));
      }
    } catch (...) {
    }
  }
  complete();
  return c10d::Work::wait(timeout);
}

void WorkDlop::complete() {
  if (completing_.exchange(true)) return;
  std::exception_ptr error;
  for (const auto& handle : handles_) {
    if (auto e = handle.error()) {
      if (auto faults = faults_.lock()) {
        try {
          std::rethrow_exception(e);
        } catch (const Error& dlop_error) {
          if (dlop_error.code() == Errc::kPeerDead) faults->report(dlop_error.what());
        } catch (...) {
        }
      }
      error = to_torch_error(e);
      break;
    }
  }
  if (!error && finish_) {
    try {
      finish_();
    } catch (...) {
      error = to_torch_error(std::current_exception());
    }
  }
  finish_ = nullptr;
  keep_alive_.clear();
  finish(error);
  if (!error) succeeded_.store(true, std::memory_order_release);
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard lock(future_mutex_);
    error_ = error;
    finished_ = true;
    future = future_;
  }
  if (future) settle(*future);
}

void WorkDlop::settle(c10::ivalue::Future& future) const {
  if (error_) {
    future.setError(error_);
  } else {
    future.markCompleted(c10::IValue(outputs_));
  }
}

c10::intrusive_ptr<c10::ivalue::Future> WorkDlop::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  bool settle_now = false;
  {
    std::lock_guard lock(future_mutex_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
      settle_now = finished_;
    }
    future = future_;
  }
  if (settle_now) settle(*future);
  return future;
}

int WorkDlop::sourceRank() const { return handles_.empty() ? -1 : handles_.front().source(); }

}  // namespace dlop::backend
