// Every DLOP_* environment variable is read here, and only here. The table in
// README.md ("Configuration") documents each one; keep the two in step.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dlop {

enum class ProgressMode { kSpin, kSleep, kAuto, kYield };

struct Config {
  std::string log_level = "warn";                 // DLOP_LOG_LEVEL
  std::chrono::milliseconds timeout{300'000};     // DLOP_TIMEOUT_MS
  ProgressMode progress = ProgressMode::kAuto;    // DLOP_PROGRESS
  std::chrono::microseconds spin{200};            // DLOP_SPIN_US
  std::chrono::milliseconds watchdog{100};        // DLOP_WATCHDOG_MS
  std::string host_id;                            // DLOP_HOST_ID (empty: hostname + boot id)
  std::string algo;                               // DLOP_ALGO, e.g. "allreduce:ring,broadcast:binomial"
  bool debug_detail = false;                      // DLOP_DEBUG=detail: cross-check every op's signature
  bool traffic_classes = true;                    // DLOP_TRAFFIC_CLASSES=0: plain submission order, no chunking
  std::size_t chunk_bytes = 8u << 20;             // DLOP_CHUNK_BYTES: all-reduces above this run in chunks
  std::size_t device_chunk_bytes = 4u << 20;      // DLOP_DEVICE_CHUNK_BYTES: staged device all-reduces go in chunks of this
  std::string trace_dir;                          // DLOP_TRACE: write a Chrome trace per process here
  std::size_t data_rate_mbps = 1000;              // DLOP_DATA_RATE_MBPS: offloaded batches' MB/s while gradients move
  std::size_t data_piece_bytes = 0;               // DLOP_DATA_PIECE_BYTES: paced batches travel in pieces (0: whole)
  std::chrono::milliseconds store_retry{60'000};  // DLOP_STORE_RETRY_MS: the most a remote read retries in all
  std::string store_cache_dir;                    // DLOP_STORE_CACHE_DIR: cache remote ranges here (empty: no cache)
  std::uint64_t store_cache_bytes = 4ull << 30;   // DLOP_STORE_CACHE_BYTES: the cache's size limit

  // Reads the environment; throws dlop::Error naming the variable on a bad value.
  static Config from_env();
};

// The process-wide configuration, read from the environment on first use.
const Config& config();

}  // namespace dlop
