// A timeline of what this process did, for Perfetto / chrome://tracing:
// DLOP_TRACE=DIR makes every recorded span a complete ("X") event in
// DIR/dlop-trace-<host>-<pid>.json ({"traceEvents": [...]}, microseconds of
// the monotonic clock, so files of one host line up). The file is rewritten
// with every event so far on flush(): at engine teardown and at exit.
//
// Any layer may record spans (the engine: collectives and their chunks;
// the lease manager: batch leases, ready batches and the consumer's waits). When DLOP_TRACE is unset,
// trace::enabled() is one predictable branch and nothing else runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dlop::trace {

using Clock = std::chrono::steady_clock;
using Arg = std::pair<std::string, std::variant<std::int64_t, std::string>>;

namespace detail {
bool read_enabled();
}

// Whether DLOP_TRACE is set (read once).
inline bool enabled() {
  static const bool on = detail::read_enabled();
  return on;
}

// Records one span [start, end] named `name` in category `category` on the
// calling thread's track. Call only when enabled().
void span(std::string name, std::string category, Clock::time_point start, Clock::time_point end,
          std::vector<Arg> args = {});

// Writes the file now (a no-op when tracing is off or nothing was recorded).
void flush();

// The file this process writes to (empty when tracing is off).
std::string file_path();

}  // namespace dlop::trace
