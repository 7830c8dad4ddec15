#include "core/config.hpp"

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "core/error.hpp"

namespace dlop {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

long long parse_count(const char* name, std::string_view text) {
  long long value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("{}='{}' is not a non-negative integer", name, text));
  }
  return value;
}

ProgressMode parse_progress(std::string_view text) {
  if (text == "spin") return ProgressMode::kSpin;
  if (text == "sleep") return ProgressMode::kSleep;
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "yield") return ProgressMode::kYield;
  throw_error(Errc::kInvalidArgument,
              fmt::format("DLOP_PROGRESS='{}' is not one of spin, sleep, auto", text));
}

}  // namespace

Config Config::from_env() {
  Config c;
  if (const char* v = env("DLOP_LOG_LEVEL")) c.log_level = v;
  if (const char* v = env("DLOP_TIMEOUT_MS")) c.timeout = std::chrono::milliseconds(parse_count("DLOP_TIMEOUT_MS", v));
  if (const char* v = env("DLOP_PROGRESS")) c.progress = parse_progress(v);
  if (const char* v = env("DLOP_SPIN_US")) c.spin = std::chrono::microseconds(parse_count("DLOP_SPIN_US", v));
  if (const char* v = env("DLOP_WATCHDOG_MS")) c.watchdog = std::chrono::milliseconds(parse_count("DLOP_WATCHDOG_MS", v));
  if (const char* v = env("DLOP_HOST_ID")) c.host_id = v;
  if (const char* v = env("DLOP_ALGO")) c.algo = v;
  if (const char* v = env("DLOP_DEBUG")) {
    if (std::string_view(v) != "detail" && std::string_view(v) != "off") {
      throw_error(Errc::kInvalidArgument, fmt::format("DLOP_DEBUG='{}' is not one of off, detail", v));
    }
    c.debug_detail = std::string_view(v) == "detail";
  }
  if (const char* v = env("DLOP_TRAFFIC_CLASSES")) {
    if (std::string_view(v) != "0" && std::string_view(v) != "1") {
      throw_error(Errc::kInvalidArgument, fmt::format("DLOP_TRAFFIC_CLASSES='{}' is not 0 or 1", v));
    }
    c.traffic_classes = std::string_view(v) == "1";
  }
  if (const char* v = env("DLOP_CHUNK_BYTES")) {
    c.chunk_bytes = static_cast<std::size_t>(parse_count("DLOP_CHUNK_BYTES", v));
    if (c.chunk_bytes == 0) throw_error(Errc::kInvalidArgument, "DLOP_CHUNK_BYTES must be at least 1");
  }
  if (const char* v = env("DLOP_DEVICE_CHUNK_BYTES")) {
    c.device_chunk_bytes = static_cast<std::size_t>(parse_count("DLOP_DEVICE_CHUNK_BYTES", v));
    if (c.device_chunk_bytes == 0) throw_error(Errc::kInvalidArgument, "DLOP_DEVICE_CHUNK_BYTES must be at least 1");
  }
  if (const char* v = env("DLOP_TRACE")) c.trace_dir = v;
  if (const char* v = env("DLOP_DATA_RATE_MBPS")) {
    c.data_rate_mbps = static_cast<std::size_t>(parse_count("DLOP_DATA_RATE_MBPS", v));
    if (c.data_rate_mbps == 0) throw_error(Errc::kInvalidArgument, "DLOP_DATA_RATE_MBPS must be at least 1");
  }
  if (const char* v = env("DLOP_DATA_PIECE_BYTES")) {
    // 0: whole batches; below the protocol's least piece, the daemon refuses it by name.
    c.data_piece_bytes = static_cast<std::size_t>(parse_count("DLOP_DATA_PIECE_BYTES", v));
  }
  if (const char* v = env("DLOP_STORE_RETRY_MS")) {
    c.store_retry = std::chrono::milliseconds(parse_count("DLOP_STORE_RETRY_MS", v));
  }
  if (const char* v = env("DLOP_STORE_CACHE_DIR")) c.store_cache_dir = v;
  if (const char* v = env("DLOP_STORE_CACHE_BYTES")) {
    c.store_cache_bytes = static_cast<std::uint64_t>(parse_count("DLOP_STORE_CACHE_BYTES", v));
  }
  if (c.watchdog.count() == 0) {
    throw_error(Errc::kInvalidArgument, "DLOP_WATCHDOG_MS must be at least 1");
  }
  return c;
}

const Config& config() {
  static const Config instance = Config::from_env();
  return instance;
}

}  // namespace dlop
