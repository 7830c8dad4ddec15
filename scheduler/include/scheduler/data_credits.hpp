// Pacing of data traffic (offloaded batches) against gradient traffic on the
// same links. The engine counts its gradient collectives in flight; a data
// mover asks for credit before moving each piece of a batch:
//
//   - no gradient collective in flight: every byte asked for is granted;
//   - one or more in flight: at most `bytes_per_interval` bytes are granted
//     per `interval` (all callers together); the rest is refused for now
//     (the caller moves what it was granted and asks again, e.g. after
//     interval());
//   - data due by the next step (deadline_step <= step() + 1) is escalated
//     and granted in full regardless: the step must never wait on a batch
//     because gradients of the step before it were busy.
//
// Thread-safe: the engine's thread reports gradients, any thread acquires.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/config.hpp"

namespace dlop::sched {

class DataCredits {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    // DLOP_DATA_RATE_MBPS (MB/s) in 1 ms intervals.
    std::size_t bytes_per_interval = config().data_rate_mbps * 1000;
    std::chrono::microseconds interval{1000};
  };

  DataCredits() : DataCredits(Options{}) {}
  explicit DataCredits(Options options) : options_(options) {}

  // The engine's side.
  void gradient_started() { gradients_.fetch_add(1, std::memory_order_relaxed); }
  void gradient_finished() { gradients_.fetch_sub(1, std::memory_order_relaxed); }
  bool gradient_in_flight() const { return gradients_.load(std::memory_order_relaxed) > 0; }

  // The training step now running (set by whoever drives steps, e.g. the
  // offload client when the trainer takes a batch). Starts at 0.
  void set_step(std::uint64_t step) { step_.store(step, std::memory_order_relaxed); }
  std::uint64_t step() const { return step_.load(std::memory_order_relaxed); }

  // Bytes of `bytes` the caller may move now for data the step
  // `deadline_step` consumes (0: none yet; ask again after interval()).
  std::size_t acquire(std::size_t bytes, std::uint64_t deadline_step, Clock::time_point now = Clock::now());

  const Options& options() const { return options_; }

 private:
  Options options_;
  std::atomic<int> gradients_{0};
  std::atomic<std::uint64_t> step_{0};
  std::mutex mutex_;  // the interval's budget
  Clock::time_point interval_start_{};
  std::size_t granted_in_interval_ = 0;
};

}  // namespace dlop::sched
