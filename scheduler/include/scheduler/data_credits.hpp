// Pacing of data traffic (offloaded batches) against gradient traffic on the
// same links. The engine counts its gradient collectives in flight; a data
// mover asks for credit before moving each piece of a batch:
//
//   - no gradient collective in flight (a quiet spell): granted if it will
//     have moved before the next gradient is due. Training repeats itself,
//     so spell k of a step (counted from the step's start, set_step) is
//     predicted to last as long as the shortest spell k of the last few
//     steps; a piece takes bytes / the median rate the movers reported
//     (data_moved), after what was granted before it in this spell. A
//     piece that cannot move in time waits for a later spell; one that
//     would fit in none of the step's spells goes at once. Until spells and
//     rates are known (the first steps), or once a spell has lasted twice
//     its longest recent length (the pattern broke: evaluation, the end of
//     training), everything is granted;
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
// Gradients moved outside the engine whose end nobody reports (a device
// backend's work, which ends on the device) are counted until a check says
// they ended; acquire() and time_for() run the checks first, so nothing
// polls for them (gradient_until).
//
// Thread-safe: the engine's thread reports gradients, any thread acquires.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

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
    // Data granted in a quiet spell is due to have moved this long before
    // the spell's predicted end.
    std::chrono::microseconds quiet_margin{2'000};
  };

  DataCredits() : DataCredits(Options{}) {}
  explicit DataCredits(Options options) : options_(options) {}

  // The engine's side.
  void gradient_started(Clock::time_point now = Clock::now());
  void gradient_finished(Clock::time_point now = Clock::now());
  bool gradient_in_flight() const { return gradients_in_flight() > 0; }
  int gradients_in_flight() const { return gradients_.load(std::memory_order_relaxed); }
  // A gradient started now that ends when `ended()` first returns true.
  // check_outside() asks, oldest first, and stops at the first that has
  // not ended (a device ends its collectives in order), so each check costs
  // at most one more question than the ones that ended. `ended` runs on the
  // checking thread with no lock of this class held; it must not block.
  void gradient_until(std::function<bool()> ended, Clock::time_point now = Clock::now());
  void check_outside(Clock::time_point now = Clock::now());

  // The training step now running (set by whoever drives steps, e.g. the
  // offload client when the trainer takes a batch). Starts at 0.
  void set_step(std::uint64_t step);
  std::uint64_t step() const { return step_.load(std::memory_order_relaxed); }

  // Bytes of `bytes` the caller may move now for data the step
  // `deadline_step` consumes (0: none yet).
  std::size_t acquire(std::size_t bytes, std::uint64_t deadline_step, Clock::time_point now = Clock::now());
  // How long until `bytes` may be granted: credit accrued while gradients
  // move, the spell's predicted end (or its breaking) while quiet.
  std::chrono::microseconds time_for(std::size_t bytes, Clock::time_point now = Clock::now());
  // A mover's report: `bytes` granted took `took` to land.
  void data_moved(std::size_t bytes, std::chrono::microseconds took);

  // `wake` runs whenever no gradient is in flight any more; one per key.
  // It must be quick and take no lock its remover holds.
  void add_waker(const void* key, std::function<void()> wake);
  void remove_waker(const void* key);

  const Options& options() const { return options_; }

 private:
  // The quiet spell now, as recent steps predict it (mutex_ held).
  struct Spell {
    Clock::time_point due;     // its shortest recent length: the next gradient may start
    Clock::time_point broken;  // twice its longest recent length (and the margin): the pattern broke
    std::chrono::microseconds roomiest;  // the step's longest predicted spell
  };
  static constexpr std::size_t kSpellsPerStep = 64;  // spells later in a step are not predicted
  static constexpr std::size_t kStepsRemembered = 8;
  static constexpr std::size_t kRatesRemembered = 8;

  // Credit accrued by `now` (mutex_ held).
  void accrue(Clock::time_point now);
  std::optional<Spell> spell() const;
  // Microseconds `bytes` take at the median recent rate (mutex_ held; rates known).
  std::chrono::microseconds moving_time(std::size_t bytes) const;

  Options options_;
  std::atomic<int> gradients_{0};
  std::atomic<std::uint64_t> step_{0};
  std::mutex mutex_;  // the bucket
  double credit_ = 0;
  Clock::time_point accrued_at_{};
  // Quiet spells: lengths of spell k of recent steps, the spell now (its
  // index, start, and when what it granted will have moved), the rates.
  std::array<std::deque<std::chrono::microseconds>, kSpellsPerStep> spells_;
  std::size_t spells_this_step_ = 0;
  std::optional<std::size_t> quiet_spell_;
  Clock::time_point quiet_since_{};
  Clock::time_point busy_until_{};
  std::deque<double> rates_;  // bytes per microsecond
  std::mutex wakers_mutex_;
  std::map<const void*, std::function<void()>> wakers_;
  // gradient_until's, oldest first; one checker at a time.
  std::mutex outside_mutex_;
  std::deque<std::function<bool()>> outside_;
  std::atomic<bool> has_outside_{false};
};

}  // namespace dlop::sched
