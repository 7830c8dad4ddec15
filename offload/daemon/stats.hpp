// The daemon's counters, updated by the compute threads and the event loop
// and read for STATS replies and the metrics endpoint: relaxed atomics, since
// each is a plain sum or a level.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "offload/protocol_messages.hpp"

namespace dlop::offload::daemon {

struct StageCounter {
  std::atomic<std::uint64_t> items{0};
  std::atomic<std::uint64_t> nanoseconds{0};
  std::atomic<std::uint64_t> bytes{0};

  void add(std::uint64_t n, double seconds, std::uint64_t b) {
    add(n, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds)), b);
  }
  void add(std::uint64_t n, std::chrono::nanoseconds t, std::uint64_t b) {
    items.fetch_add(n, std::memory_order_relaxed);
    nanoseconds.fetch_add(static_cast<std::uint64_t>(t.count()), std::memory_order_relaxed);
    bytes.fetch_add(b, std::memory_order_relaxed);
  }
  protocol::StageStats snapshot(const char* name) const {
    return {name, items.load(std::memory_order_relaxed),
            static_cast<double>(nanoseconds.load(std::memory_order_relaxed)) * 1e-9,
            bytes.load(std::memory_order_relaxed)};
  }
};

// How long the compute pool spent making batches, batches still being made
// included. A batch holds `share` of the pool's `capacity` threads while it
// is made: a native batch the whole pool, a Python worker's batch one of the
// connection's workers. Locked twice per batch and once per reading: nothing
// per sample.
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
  Clock::time_point begin(std::size_t share) {
    const auto now = Clock::now();
    std::lock_guard lock(mutex_);
    running_share_ += share;
    running_start_ += static_cast<double>(share) * seconds(now);
    ++running_;
    return now;
  }
  void end(std::size_t share, Clock::time_point start) {
    const auto now = Clock::now();
    std::lock_guard lock(mutex_);
    running_share_ -= share;
    running_start_ -= static_cast<double>(share) * seconds(start);
    done_ += static_cast<double>(share) * (seconds(now) - seconds(start));
    if (--running_ == 0) running_start_ = 0;  // no rounding left over from the sums
  }
  class Scope {
   public:
    Scope(BusyMeter& meter, std::size_t share) : meter_(meter), share_(share), start_(meter.begin(share)) {}
    ~Scope() { meter_.end(share_, start_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    BusyMeter& meter_;
    std::size_t share_;
    Clock::time_point start_;
  };

  // Seconds of the whole pool spent making batches until `now`: thread
  // seconds over the capacity.
  double busy_seconds(Clock::time_point now) const {
    std::lock_guard lock(mutex_);
    const double running = static_cast<double>(running_share_) * seconds(now) - running_start_;
    return (done_ + running) / static_cast<double>(capacity_);
  }
  // Batches being made now.
  std::size_t running() const {
    std::lock_guard lock(mutex_);
    return running_;
  }

 private:
  // Since the meter was made, so that the sums stay small.
  double seconds(Clock::time_point t) const { return std::chrono::duration<double>(t - origin_).count(); }

  const Clock::time_point origin_ = Clock::now();
  mutable std::mutex mutex_;
  std::size_t capacity_ = 1;
  double done_ = 0;             // thread seconds of the batches that ended
  std::size_t running_share_ = 0;  // threads held by the batches being made
  double running_start_ = 0;    // the sum of share x start over them
  std::size_t running_ = 0;
};

struct DaemonStats {
  // Stages, as Pipeline::run_batch times them per sample (seconds summed
  // over the compute threads, so items / seconds is the rate per thread).
  StageCounter read;     // samples read; encoded bytes
  StageCounter decode;   // samples decoded; their RGB bytes
  StageCounter augment;  // samples through the ops
  StageCounter collate;  // samples laid out into batch buffers; their bytes
  StageCounter batch;    // batches made: wall time of each whole batch (native and Python)
  StageCounter send;     // batches sent; bytes; from posting to UCX completion
  std::atomic<std::uint64_t> connections{0};      // accepted
  std::atomic<std::uint64_t> auth_failures{0};
  std::atomic<std::uint64_t> protocol_errors{0};  // connections closed for a bad frame
  std::atomic<std::uint64_t> batches_ready{0};
  std::atomic<std::uint64_t> batches_failed{0};
  std::atomic<std::uint64_t> samples_skipped{0};
  std::atomic<std::uint64_t> leases_canceled{0};
  std::atomic<std::uint64_t> samples_made{0};      // in batches made (skipped samples not counted)
  std::atomic<std::uint64_t> batches_refused{0};   // PRODUCEs refused while draining, queued leases included
  // Levels the event loop keeps current, for the metrics endpoint's thread.
  std::atomic<std::uint64_t> open_leases{0};
  std::atomic<std::uint64_t> open_connections{0};
  std::atomic<bool> draining{false};
  BusyMeter busy;

  protocol::Stats snapshot(std::uint64_t connections_now, std::uint64_t leases_now) const {
    protocol::Stats s;
    s.stages = {read.snapshot("read"),       decode.snapshot("decode"), augment.snapshot("augment"),
                collate.snapshot("collate"), batch.snapshot("batch"),   send.snapshot("send")};
    const auto get = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    s.counters = {{"connections", get(connections)},         {"open_connections", connections_now},
                  {"open_leases", leases_now},              {"auth_failures", get(auth_failures)},
                  {"protocol_errors", get(protocol_errors)}, {"batches_ready", get(batches_ready)},
                  {"batches_failed", get(batches_failed)},   {"samples_skipped", get(samples_skipped)},
                  {"leases_canceled", get(leases_canceled)}, {"batches_refused", get(batches_refused)},
                  {"draining", draining.load(std::memory_order_relaxed) ? 1u : 0u}};
    return s;
  }
};

}  // namespace dlop::offload::daemon
