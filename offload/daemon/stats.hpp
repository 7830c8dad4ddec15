// The daemon's counters, updated by the compute threads and the event loop
// and read for STATS replies and the metrics endpoint: relaxed atomics, since
// each is a plain sum or a level. The busy meter (busy.hpp) is read for these
// and for each BATCH_READY too.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "busy.hpp"
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

struct DaemonStats {
  // Stages, as ImagePipeline::run_batch times them per sample (seconds summed
  // over the compute threads, so items / seconds is the rate per thread).
  StageCounter read;     // samples read; encoded bytes (the Python path: what its workers read, untimed)
  StageCounter decode;   // samples decoded; what they decoded to (RGB bytes, float audio samples)
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
