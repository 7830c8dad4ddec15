#include "stream_runtime.hpp"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/file.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

namespace dlop::test_accelerator {
namespace {

// A number from the environment, or fallback when unset. A bad value is an
// error naming the variable (the extension's import fails).
double env_number(const char* name, double fallback, double min, double max, bool integral) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    return fallback;
  }
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  const bool ok = end != text && *end == '\0' && value >= min && value <= max &&
                  (!integral || value == static_cast<double>(static_cast<int64_t>(value)));
  TORCH_CHECK(ok, name, "=", text, ": expected ", integral ? "an integer" : "a number", " from ",
              static_cast<int64_t>(min), " to ", static_cast<int64_t>(max));
  return value;
}

int64_t env_us(const char* name) {
  return static_cast<int64_t>(env_number(name, 0, 0, 60e6, true));
}

// DLOP_TEST_DEVICE_SHARE: unset, the parent's processes share ("parent-<ppid>");
// 0, none or off: private; else the name (a file name part, so no '/').
std::string read_share_key() {
  const char* raw = std::getenv("DLOP_TEST_DEVICE_SHARE");
  const std::string value = raw != nullptr ? raw : "";
  if (value.empty()) {
    return "parent-" + std::to_string(getppid());
  }
  if (value == "0" || value == "none" || value == "off") {
    return {};
  }
  TORCH_CHECK(value.find('/') == std::string::npos, "DLOP_TEST_DEVICE_SHARE=", value,
              ": expected a name without '/' (or 0 for engines of this process's own)");
  return "name-" + value;
}

struct Settings {
  c10::DeviceIndex device_count;
  std::string share;  // share_key()
  std::atomic<int64_t> delay_us;
  std::atomic<double> copy_gbps;
  std::atomic<double> mem_gbps;
  std::atomic<int64_t> op_us;
  std::atomic<double> tflops;
  std::atomic<int64_t> query_us;

  Settings()
      : device_count(static_cast<c10::DeviceIndex>(env_number("DLOP_TEST_DEVICE_COUNT", 2, 1, 64, true))),
        share(read_share_key()),
        delay_us(env_us("DLOP_TEST_DEVICE_DELAY_US")),
        copy_gbps(env_number("DLOP_TEST_DEVICE_COPY_GBPS", 0, 0, 1e6, false)),
        mem_gbps(env_number("DLOP_TEST_DEVICE_MEM_GBPS", Timing::kFollowLink, 0, 1e7, false)),
        op_us(env_us("DLOP_TEST_DEVICE_OP_US")),
        tflops(env_number("DLOP_TEST_DEVICE_TFLOPS", 0, 0, 1e6, false)),
        query_us(env_us("DLOP_TEST_DEVICE_QUERY_US")) {}
};

Settings& settings() {
  static Settings instance;
  return instance;
}

thread_local c10::DeviceIndex tls_device = 0;
thread_local bool tls_stream_worker = false;
// Whether this thread is the worker of a high-priority stream.
thread_local bool tls_high_priority = false;
thread_local uint64_t tls_host_waits = 0;
// The calling thread's current stream id per device; 0 (default) until set.
thread_local std::vector<c10::StreamId> tls_streams;

c10::StreamId& current_stream_id(c10::DeviceIndex index) {
  if (tls_streams.empty()) {
    tls_streams.assign(static_cast<size_t>(device_count()), 0);
  }
  return tls_streams[static_cast<size_t>(index)];
}

// The streams of all devices. Destroyed at exit: first lets every worker run
// what is queued (a wait may name another worker's marker), then joins them.
class Registry {
 public:
  Registry() : devices_(static_cast<size_t>(device_count())) {}
  ~Registry() {
    for (auto& device : devices_) {
      for (auto& w : device.workers) {
        if (w) {
          try {
            w->wait_passed(w->last_queued());
          } catch (...) {
            // the stream failed earlier and said so to whoever waited on it
          }
        }
      }
    }
  }

  StreamWorker& worker(c10::DeviceIndex index, c10::StreamId id) {
    auto& device = devices_[static_cast<size_t>(index)];
    std::lock_guard lock(mutex_);
    TORCH_CHECK(id >= 0 && id < device.next_new_id, "dlop_test:", index, " has no stream with id ", id);
    if (device.workers.size() <= static_cast<size_t>(id)) {
      device.workers.resize(static_cast<size_t>(id) + 1);
    }
    auto& slot = device.workers[static_cast<size_t>(id)];
    if (!slot) {
      const bool high = (id > kPoolSize && id <= 2 * kPoolSize) ||
                        std::find(device.high_priority.begin(), device.high_priority.end(), id) !=
                            device.high_priority.end();
      slot = std::make_unique<StreamWorker>(high);
    }
    return *slot;
  }

  c10::StreamId pool_id(c10::DeviceIndex index, bool high_priority) {
    std::lock_guard lock(mutex_);
    auto& device = devices_[static_cast<size_t>(index)];
    auto& next = device.pool_next[high_priority ? 1 : 0];
    return 1 + (high_priority ? kPoolSize : 0) + (next++ % kPoolSize);
  }

  c10::StreamId new_id(c10::DeviceIndex index, int priority) {
    std::lock_guard lock(mutex_);
    auto& device = devices_[static_cast<size_t>(index)];
    if (priority < 0) {
      device.high_priority.push_back(device.next_new_id);
    }
    return device.next_new_id++;
  }

  int priority(c10::DeviceIndex index, c10::StreamId id) {
    if (id > kPoolSize && id <= 2 * kPoolSize) {
      return -1;
    }
    std::lock_guard lock(mutex_);
    const auto& high = devices_[static_cast<size_t>(index)].high_priority;
    return std::find(high.begin(), high.end(), id) != high.end() ? -1 : 0;
  }

  Engine& engine(c10::DeviceIndex index, EngineKind kind) {
    auto& device = devices_[static_cast<size_t>(index)];
    auto& slot = device.engines[static_cast<size_t>(kind)];
    std::lock_guard lock(mutex_);
    if (!slot) {
      slot = std::make_unique<Engine>(index, kind);
    }
    return *slot;
  }

  std::vector<StreamWorker*> workers(c10::DeviceIndex index) {
    std::lock_guard lock(mutex_);
    std::vector<StreamWorker*> out;
    for (auto& w : devices_[static_cast<size_t>(index)].workers) {
      if (w) {
        out.push_back(w.get());
      }
    }
    return out;
  }

 private:
  struct Device {
    std::vector<std::unique_ptr<StreamWorker>> workers;  // by stream id; started on first use
    c10::StreamId next_new_id = 1 + 2 * kPoolSize;
    std::array<c10::StreamId, 2> pool_next{0, 0};  // low, high
    std::vector<c10::StreamId> high_priority;      // new streams made with priority < 0
    std::array<std::unique_ptr<Engine>, 3> engines;
  };
  std::mutex mutex_;
  std::vector<Device> devices_;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

c10::Stream make_stream(c10::DeviceIndex index, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, index), id);
}

}  // namespace

Timing timing() {
  const auto& s = settings();
  Timing t;
  t.delay = std::chrono::microseconds(s.delay_us.load());
  t.copy_gbps = s.copy_gbps.load();
  t.mem_gbps = s.mem_gbps.load();
  t.op = std::chrono::microseconds(s.op_us.load());
  t.tflops = s.tflops.load();
  t.query = std::chrono::microseconds(s.query_us.load());
  return t;
}

void configure(const Timing& value) {
  TORCH_CHECK(value.delay.count() >= 0 && value.copy_gbps >= 0 && value.op.count() >= 0 && value.tflops >= 0 &&
                  value.query.count() >= 0 && (value.mem_gbps >= 0 || value.mem_gbps == Timing::kFollowLink),
              "dlop_test: times and rates must be >= 0 (mem_gbps -1: follow the link)");
  auto& s = settings();
  s.delay_us = value.delay.count();
  s.copy_gbps = value.copy_gbps;
  s.mem_gbps = value.mem_gbps;
  s.op_us = value.op.count();
  s.tflops = value.tflops;
  s.query_us = value.query.count();
}

// --- Engine ---

const std::string& share_key() {
  return settings().share;
}

namespace {

// The lock files live outside /dev/shm (whose entries tests count as leaks)
// in one folder for every user; a launcher's files go once it has exited.
std::filesystem::path lock_folder() {
  std::error_code ignored;
  auto folder = std::filesystem::temp_directory_path(ignored) / "dlop_test-engines";
  if (std::filesystem::create_directory(folder, ignored)) {
    std::filesystem::permissions(folder, std::filesystem::perms::all | std::filesystem::perms::sticky_bit, ignored);
  }
  for (const auto& entry : std::filesystem::directory_iterator(folder, ignored)) {
    const auto name = entry.path().filename().string();
    if (name.rfind("parent-", 0) != 0) continue;
    const auto pid = std::strtol(name.c_str() + 7, nullptr, 10);
    if (pid > 1 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::filesystem::remove(entry.path(), ignored);
    }
  }
  return folder;
}

}  // namespace

Engine::Engine(c10::DeviceIndex index, EngineKind kind) {
  const auto& share = share_key();
  if (share.empty()) {
    return;
  }
  static constexpr std::array<const char*, 3> kNames{"compute", "to_device", "to_host"};
  static const auto folder = lock_folder();
  const auto name = share + "-" + std::to_string(index) + "-" + kNames[static_cast<size_t>(kind)] + ".lock";
  const auto path = (folder / name).string();
  lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  TORCH_CHECK(lock_fd_ >= 0, "dlop_test: cannot open the engine lock ", path, " (DLOP_TEST_DEVICE_SHARE=0 gives ",
              "each process engines of its own): ", std::strerror(errno));
}

Engine::~Engine() {
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);
  }
}

// This process's turn first (a high-priority stream's task before any other
// waiting), then flock: it is held per open file, so it orders processes only.
void Engine::lock() {
  const bool high = tls_high_priority;
  {
    std::unique_lock state(mutex_);
    high_waiting_ += high ? 1 : 0;
    free_.wait(state, [&] { return !busy_ && (high || high_waiting_ == 0); });
    high_waiting_ -= high ? 1 : 0;
    busy_ = true;
  }
  if (lock_fd_ >= 0) {
    while (::flock(lock_fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
}

void Engine::unlock() {
  if (lock_fd_ >= 0) {
    ::flock(lock_fd_, LOCK_UN);
  }
  {
    std::lock_guard state(mutex_);
    busy_ = false;
  }
  free_.notify_all();
}

Engine& engine(c10::DeviceIndex index, EngineKind kind) {
  check_device(index);
  return registry().engine(index, kind);
}

c10::DeviceIndex device_count() noexcept {
  try {
    return settings().device_count;
  } catch (...) {
    return 0;  // a bad DLOP_TEST_DEVICE_COUNT: the import reported it already
  }
}

void check_device(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "dlop_test: no device ", static_cast<int>(index),
              " (there are ", static_cast<int>(device_count()), "; DLOP_TEST_DEVICE_COUNT sets how many)");
}

c10::DeviceIndex current_device() noexcept {
  return tls_device;
}

void set_current_device(c10::DeviceIndex index) {
  check_device(index);
  tls_device = index;
}

c10::Device resolve(c10::Device device) {
  TORCH_CHECK(device.is_privateuseone(), "dlop_test: expected a dlop_test device, got ", device);
  const auto index = device.has_index() ? device.index() : current_device();
  check_device(index);
  return {c10::DeviceType::PrivateUse1, index};
}

// --- StreamWorker ---

StreamWorker::StreamWorker(bool high_priority)
    : thread_([this, high_priority] {
        tls_stream_worker = true;
        tls_high_priority = high_priority;
        run();
      }) {}

StreamWorker::~StreamWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_one();
  thread_.join();
}

uint64_t StreamWorker::enqueue(std::function<void()> task) {
  uint64_t position = 0;
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
    position = ++queued_;
  }
  work_ready_.notify_one();
  return position;
}

bool StreamWorker::passed(uint64_t position) const {
  std::lock_guard lock(mutex_);
  if (error_) {
    std::rethrow_exception(error_);
  }
  return done_ >= position;
}

void StreamWorker::wait_passed(uint64_t position) const {
  if (!tls_stream_worker) {
    ++tls_host_waits;
  }
  std::unique_lock lock(mutex_);
  task_done_.wait(lock, [&] { return done_ >= position; });
  if (error_) {
    std::rethrow_exception(error_);
  }
}

uint64_t StreamWorker::last_queued() const {
  std::lock_guard lock(mutex_);
  return queued_;
}

void StreamWorker::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) {
        return;  // stopping, and everything queued has run
      }
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    // Tasks are checked when queued; one that throws anyway (out of memory)
    // leaves the stream's data undefined: the error sticks to the stream and
    // every later wait on it re-throws it on the waiting thread.
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    task = nullptr;  // release what the task held before reporting it done
    {
      std::lock_guard lock(mutex_);
      if (error && !error_) {
        error_ = error;
      }
      ++done_;
    }
    task_done_.notify_all();
  }
}

// --- streams ---

StreamWorker& worker(const c10::Stream& stream) {
  const auto device = resolve(stream.device());
  return registry().worker(device.index(), stream.id());
}

c10::Stream default_stream(c10::DeviceIndex index) {
  check_device(index);
  return make_stream(index, 0);
}

c10::Stream pool_stream(c10::DeviceIndex index, bool high_priority) {
  check_device(index);
  return make_stream(index, registry().pool_id(index, high_priority));
}

c10::Stream new_stream(c10::DeviceIndex index, int priority) {
  check_device(index);
  return make_stream(index, registry().new_id(index, priority));
}

int stream_priority(const c10::Stream& stream) {
  const auto index = resolve(stream.device()).index();
  return registry().priority(index, stream.id());
}

c10::Stream current_stream(c10::DeviceIndex index) {
  check_device(index);
  return make_stream(index, current_stream_id(index));
}

c10::Stream exchange_stream(const c10::Stream& stream) {
  const auto index = resolve(stream.device()).index();
  worker(stream);  // checks that the stream exists
  auto& id = current_stream_id(index);
  const auto previous = make_stream(index, id);
  id = stream.id();
  return previous;
}

std::vector<StreamWorker*> stream_workers(c10::DeviceIndex index) {
  check_device(index);
  return registry().workers(index);
}

void synchronize_device(c10::DeviceIndex index) {
  check_device(index);
  for (auto* w : registry().workers(index)) {
    w->wait_passed(w->last_queued());
  }
}

uint64_t host_waits() noexcept {
  return tls_host_waits;
}

bool on_stream_worker() noexcept {
  return tls_stream_worker;
}

// --- Event ---

void Event::record(const c10::Stream& stream) {
  auto& w = worker(stream);
  auto passed_at = std::make_shared<std::chrono::steady_clock::time_point>();
  const auto position = w.enqueue([passed_at] { *passed_at = std::chrono::steady_clock::now(); });
  std::lock_guard lock(mutex_);
  marker_ = {&w, position, std::move(passed_at)};
}

Event::Marker Event::last() const {
  std::lock_guard lock(mutex_);
  return marker_;
}

void Event::block(const c10::Stream& stream) const {
  const auto marker = last();
  auto& w = worker(stream);
  if (marker.worker == nullptr || marker.worker == &w) {
    return;  // never recorded, or recorded on this very stream: already in order
  }
  w.enqueue([marker] { marker.worker->wait_passed(marker.position); });
}

namespace {
std::atomic<uint64_t> g_event_queries{0};
}  // namespace

uint64_t event_queries() { return g_event_queries.load(std::memory_order_relaxed); }

// A driver call: the host spins for its cost, as it would in the driver.
bool Event::query() const {
  g_event_queries.fetch_add(1, std::memory_order_relaxed);
  const auto cost = std::chrono::microseconds(settings().query_us.load(std::memory_order_relaxed));
  if (cost.count() > 0) {
    const auto until = std::chrono::steady_clock::now() + cost;
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  const auto marker = last();
  return marker.worker == nullptr || marker.worker->passed(marker.position);
}

void Event::synchronize() const {
  const auto marker = last();
  if (marker.worker == nullptr) {
    return;
  }
  if (on_stream_worker()) {
    marker.worker->wait_passed(marker.position);
    return;
  }
  ++tls_host_waits;
  while (!marker.worker->passed(marker.position)) {
    std::this_thread::yield();  // a spin that lets a thread of the same core in, as cudaDeviceScheduleYield does
  }
}

double Event::elapsed_ms(const Event& start, const Event& end) {
  const auto a = start.last();
  const auto b = end.last();
  TORCH_CHECK(a.worker != nullptr && b.worker != nullptr, "dlop_test: elapsed_time needs two recorded events");
  TORCH_CHECK(a.worker->passed(a.position) && b.worker->passed(b.position),
              "dlop_test: elapsed_time needs both events to have completed (synchronize them first)");
  return std::chrono::duration<double, std::milli>(*b.passed_at - *a.passed_at).count();
}

}  // namespace dlop::test_accelerator
