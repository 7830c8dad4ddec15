// Pacing of data traffic (offloaded batches) against gradient traffic on the
// same links. The engine counts its gradient collectives in flight; a data
// mover asks for credit before moving each piece of a batch:
//
//   - no gradient collective in flight: every byte asked for is granted;
//   - one or more in flight: credit accrues at `bytes_per_interval` per
//     `interval` (all callers together) from the moment the first one
//     started, saved up to `burst` worth of it; a caller gets what has
//     accrued, and time_for() says when the rest will have;
//   - data due by the next step (deadline_step <= step() + 1) is escalated
//     and granted in full regardless: the step must never wait on a batch
//     because gradients of the step before it were busy.
//
// When the last gradient in flight finishes, the wakers run (on the engine's
// thread): a mover holding data back need not poll for that moment.
//
// Thread-safe: the engine's thread reports gradients, any thread acquires.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include "core/config.hpp"

namespace dlop::sched {

class DataCredits {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    // DLOP_DATA_RATE_MBPS (MB/s, so many bytes per microsecond).
    std::size_t bytes_per_interval = config().data_rate_mbps * 1000;
    std::chrono::microseconds interval{1000};
    // Credit a mover that asks seldom may find saved up.
    std::chrono::microseconds burst{10'000};
  };

  DataCredits() : DataCredits(Options{}) {}
  explicit DataCredits(Options options) : options_(options) {}

  // The engine's side.
  void gradient_started(Clock::time_point now = Clock::now());
  void gradient_finished();
  bool gradient_in_flight() const { return gradients_.load(std::memory_order_relaxed) > 0; }

  // The training step now running (set by whoever drives steps, e.g. the
  // offload client when the trainer takes a batch). Starts at 0.
  void set_step(std::uint64_t step) { step_.store(step, std::memory_order_relaxed); }
  std::uint64_t step() const { return step_.load(std::memory_order_relaxed); }

  // Bytes of `bytes` the caller may move now for data the step
  // `deadline_step` consumes (0: none yet).
  std::size_t acquire(std::size_t bytes, std::uint64_t deadline_step, Clock::time_point now = Clock::now());
  // How long until `bytes` will have accrued, while gradients move.
  std::chrono::microseconds time_for(std::size_t bytes, Clock::time_point now = Clock::now());

  // `wake` runs whenever no gradient is in flight any more; one per key.
  // It must be quick and take no lock its remover holds.
  void add_waker(const void* key, std::function<void()> wake);
  void remove_waker(const void* key);

  const Options& options() const { return options_; }

 private:
  // Credit accrued by `now` (mutex_ held).
  void accrue(Clock::time_point now);

  Options options_;
  std::atomic<int> gradients_{0};
  std::atomic<std::uint64_t> step_{0};
  std::mutex mutex_;  // the bucket
  double credit_ = 0;
  Clock::time_point accrued_at_{};
  std::mutex wakers_mutex_;
  std::map<const void*, std::function<void()>> wakers_;
};

}  // namespace dlop::sched
