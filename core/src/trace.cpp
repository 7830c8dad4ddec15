#include "core/trace.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/config.hpp"
#include "core/log.hpp"

namespace dlop::trace {
namespace {

struct Event {
  std::string name;
  std::string category;
  std::int64_t ts_us;
  std::int64_t dur_us;
  int tid;
  std::vector<Arg> args;
};

struct Recorder {
  std::mutex mutex;
  std::vector<Event> events;
  int pid = 0;  // the process the events belong to: a forked child starts afresh
};

Recorder& recorder() {
  static auto* instance = new Recorder;  // never destroyed: flushed at exit by atexit
  return *instance;
}

std::int64_t micros(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

int thread_id() {
  thread_local const int tid = static_cast<int>(::syscall(SYS_gettid));
  return tid;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "host";
  return name;
}

}  // namespace

namespace detail {
bool read_enabled() {
  if (config().trace_dir.empty()) return false;
  std::atexit([] { flush(); });
  return true;
}
}  // namespace detail

std::string file_path() {
  if (!enabled()) return {};
  return (std::filesystem::path(config().trace_dir) / fmt::format("dlop-trace-{}-{}.json", host_name(), ::getpid())).string();
}

void span(std::string name, std::string category, Clock::time_point start, Clock::time_point end,
          std::vector<Arg> args) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  if (r.pid != ::getpid()) {  // inherited from the parent over fork: not ours
    r.events.clear();
    r.pid = ::getpid();
  }
  r.events.push_back({std::move(name), std::move(category), micros(start), std::max<std::int64_t>(0, micros(end) - micros(start)),
                      thread_id(), std::move(args)});
}

void flush() {
  if (!enabled()) return;
  Recorder& r = recorder();
  nlohmann::json events = nlohmann::json::array();
  {
    std::lock_guard lock(r.mutex);
    if (r.pid != ::getpid() || r.events.empty()) return;
    for (const Event& e : r.events) {
      nlohmann::json args = nlohmann::json::object();
      for (const auto& [key, value] : e.args) {
        std::visit([&, &key = key](const auto& v) { args[key] = v; }, value);
      }
      events.push_back({{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"ts", e.ts_us}, {"dur", e.dur_us},
                        {"pid", r.pid}, {"tid", e.tid}, {"args", std::move(args)}});
    }
  }
  const std::string path = file_path();
  try {
    std::filesystem::create_directories(config().trace_dir);
    const std::string partial = path + ".partial";
    {
      std::ofstream out(partial, std::ios::trunc);
      out << nlohmann::json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump() << '\n';
      if (!out) throw std::runtime_error("write failed");
    }
    std::filesystem::rename(partial, path);  // readers never see half a file
  } catch (const std::exception& e) {
    log().warn("DLOP_TRACE: cannot write {}: {}", path, e.what());
  }
}

}  // namespace dlop::trace
