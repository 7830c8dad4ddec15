// How busy the daemon's compute pool is: the seconds it spent making batches
// (BusyMeter) and the share of a trailing window it spent so (BusyWindow),
// for the metrics endpoint and for every BATCH_READY, which carries it to
// the trainers' fleet sizing (dlop.data.autoscale). Both read the one window,
// protocol::BatchReady::kBusyWindow, so that the daemon's
// dlop_offloader_busy_ratio and the trainers' dlop_data_offloader_busy_ratio
// are the same figure.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>

#include "offload/protocol_messages.hpp"

namespace dlop::offload::daemon {

// The threads held over time, as a step function noted at each change, kept
// for the last `longest`. Between two changes the thread seconds grow
// linearly, so the mean over any window up to `longest` is exact, however
// rarely it is read: nobody has to sample it on a timer. Not locked:
// BusyMeter keeps one under its lock.
class BusyWindow {
 public:
  using Clock = std::chrono::steady_clock;

  BusyWindow(Clock::duration longest, Clock::time_point start) : longest_(longest) { notes_.push_back({start, 0, 0}); }

  // From `t` on, `threads` are held. A `t` before the last change counts as
  // the last change's time (callers read the clock before they lock).
  void set(Clock::time_point t, std::size_t threads) {
    t = std::max(t, notes_.back().t);
    const double seconds = total(t);
    if (notes_.back().t == t) {
      notes_.back() = {t, seconds, threads};
    } else {
      notes_.push_back({t, seconds, threads});
    }
    // Keep the newest note at least `longest` old (where the longest window
    // may begin), and those after it.
    while (notes_.size() > 1 && notes_[1].t <= t - longest_) notes_.pop_front();
  }

  // Thread seconds held from the start until `t`.
  double total(Clock::time_point t) const {
    // The last change at or before t; the first note if t precedes every one.
    auto it =
        std::upper_bound(notes_.begin(), notes_.end(), t, [](Clock::time_point x, const Note& n) { return x < n.t; });
    if (it != notes_.begin()) --it;
    return it->seconds + static_cast<double>(it->threads) * seconds_between(it->t, std::max(t, it->t));
  }

  // The mean threads held over [now - window, now] (window at most
  // `longest`), or since the start when that is later; 0 over no time.
  double mean(Clock::time_point now, Clock::duration window) const {
    const Clock::time_point from = std::max(now - std::min(window, longest_), notes_.front().t);
    if (now <= from) return 0;
    return (total(now) - total(from)) / seconds_between(from, now);
  }

  // Notes kept (for tests: the window stays bounded).
  std::size_t notes() const { return notes_.size(); }

 private:
  struct Note {
    Clock::time_point t;
    double seconds;       // thread seconds held before t
    std::size_t threads;  // held from t to the next note
  };
  static double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }

  Clock::duration longest_;
  std::deque<Note> notes_;  // oldest first, never empty
};

// How long the compute pool spent making batches, batches still being made
// included. A batch holds `share` of the pool's `capacity` threads while it
// is made: a native batch the whole pool, a Python worker's batch one of the
// connection's workers. Locked twice per batch and once per reading: nothing
// per sample. Thread-safe.
class BusyMeter {
 public:
  using Clock = std::chrono::steady_clock;

  void set_capacity(std::size_t threads) {
    std::lock_guard lock(mutex_);
    capacity_ = std::max<std::size_t>(1, threads);
  }
  std::size_t capacity() const {
    std::lock_guard lock(mutex_);
    return capacity_;
  }

  // A batch begins and ends; a Scope does both.
  void begin(std::size_t share) { change(share, true); }
  void end(std::size_t share) { change(share, false); }
  class Scope {
   public:
    Scope(BusyMeter& meter, std::size_t share) : meter_(meter), share_(share) { meter_.begin(share_); }
    ~Scope() { meter_.end(share_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    BusyMeter& meter_;
    std::size_t share_;
  };

  // Seconds of the whole pool spent making batches until now: thread
  // seconds over the capacity.
  double busy_seconds() const {
    const auto now = Clock::now();
    std::lock_guard lock(mutex_);
    return window_.total(now) / static_cast<double>(capacity_);
  }
  // The share of the last `window` (at most kBusyWindow) the pool spent
  // making batches, in [0, 1]: 1 also when Python workers outnumber the
  // threads.
  double fraction(Clock::duration window = protocol::BatchReady::kBusyWindow) const {
    const auto now = Clock::now();
    std::lock_guard lock(mutex_);
    return std::clamp(window_.mean(now, window) / static_cast<double>(capacity_), 0.0, 1.0);
  }
  // Batches being made now.
  std::size_t running() const {
    std::lock_guard lock(mutex_);
    return running_;
  }

 private:
  void change(std::size_t share, bool begins) {
    const auto now = Clock::now();
    std::lock_guard lock(mutex_);
    held_ = begins ? held_ + share : held_ - share;
    running_ = begins ? running_ + 1 : running_ - 1;
    window_.set(now, held_);
  }

  mutable std::mutex mutex_;
  std::size_t capacity_ = 1;
  std::size_t held_ = 0;  // threads held by the batches being made
  std::size_t running_ = 0;
  BusyWindow window_{protocol::BatchReady::kBusyWindow, Clock::now()};
};

}  // namespace dlop::offload::daemon
