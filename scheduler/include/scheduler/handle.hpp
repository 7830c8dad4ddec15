// The future of one submitted operation.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace dlop::sched {

namespace detail {
struct OpState;
}

class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<detail::OpState> state) : state_(std::move(state)) {}

  // True once the operation finished, successfully or not. Never blocks; may
  // progress the engine a little.
  bool test() const;
  // Waits until finished; rethrows its error. Throws dlop::Error(kTimeout)
  // naming the operation if it is still running after `timeout`.
  void wait(std::chrono::milliseconds timeout) const;
  void wait() const;  // with the operation's own timeout
  // The error it failed with, or null (also while running).
  std::exception_ptr error() const;
  // Runs once the operation finishes (at once if it has), on the thread that
  // finished it: keep it short and do not wait on other handles in it.
  void on_complete(std::function<void(std::exception_ptr)> callback) const;
  // For a completed point-to-point receive: the rank it came from; else -1.
  int source() const;
  // "allreduce #12 (1024 x float, sum) on communicator 0", for messages.
  std::string describe() const;

 private:
  std::shared_ptr<detail::OpState> state_;
};

}  // namespace dlop::sched
