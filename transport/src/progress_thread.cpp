#include "transport/progress_thread.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dlop::transport {
namespace {

int make_eventfd() {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) throw_error(Errc::kSystem, std::string("eventfd: ") + std::strerror(errno));
  return fd;
}

void signal(int fd) {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof(one));  // EAGAIN: already signaled
}

}  // namespace

ProgressThread::ProgressThread(std::shared_ptr<UcxWorker> worker, const std::string& name)
    : worker_(std::move(worker)) {
  if (!worker_) throw_error(Errc::kInvalidArgument, "ProgressThread needs a worker");
  stop_fd_ = make_eventfd();
  try {
    activity_fd_ = make_eventfd();
    wake_fd_ = make_eventfd();
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    for (const int fd : {stop_fd_, activity_fd_, wake_fd_}) {
      if (fd >= 0) ::close(fd);
    }
    throw;
  }
  ::pthread_setname_np(thread_.native_handle(), name.substr(0, 15).c_str());
}

ProgressThread::~ProgressThread() {
  stopping_.store(true, std::memory_order_relaxed);
  signal(stop_fd_);
  thread_.join();
  ::close(stop_fd_);
  ::close(activity_fd_);
  ::close(wake_fd_);
}

void ProgressThread::wake() { signal(wake_fd_); }

void ProgressThread::drain_activity() {
  std::uint64_t count = 0;
  [[maybe_unused]] const ssize_t n = ::read(activity_fd_, &count, sizeof(count));
}

void ProgressThread::set_hook(const void* key, PassHook hook) {
  std::lock_guard guard(mutex_);
  hooks_[key] = std::move(hook);
}

void ProgressThread::remove_hook(const void* key) {
  std::lock_guard guard(mutex_);
  hooks_.erase(key);
}

void ProgressThread::run() {
  while (!stopping_.load(std::memory_order_relaxed)) {
    bool any = false;
    bool armed = false;
    std::chrono::microseconds look_again{10'000};
    try {
      std::lock_guard guard(mutex_);
      while (worker_->progress()) any = true;
      for (const auto& [key, hook] : hooks_) {
        if (const auto within = hook()) look_again = std::min(look_again, *within);
      }
      while (worker_->progress()) any = true;  // what a hook posted
      // Counted under the lock: whoever sees this pass's completions (it
      // needs the lock) sees the count too.
      if (any) active_passes_.fetch_add(1, std::memory_order_relaxed);
      armed = worker_->arm();
    } catch (const std::exception& e) {
      log().error("UCX progress thread: {}", e.what());
    }
    if (any) signal(activity_fd_);
    if (!armed && worker_->can_sleep()) continue;  // events came meanwhile: progress them
    // Bounded: an operation another thread posts on an armed worker (a receive,
    // an endpoint's wire-up) does not signal the event fd, yet may need
    // progress to move; 10 ms bounds that wait. Without wake-up support this is
    // the polling interval.
    const int ms = static_cast<int>(std::max<std::int64_t>(1, (look_again.count() + 999) / 1000));
    pollfd fds[3] = {{stop_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}, {worker_->event_fd(), POLLIN, 0}};
    ::poll(fds, worker_->can_sleep() ? 3 : 2, worker_->can_sleep() ? ms : 1);
    if (fds[1].revents & POLLIN) {
      std::uint64_t woken = 0;
      [[maybe_unused]] const ssize_t n = ::read(wake_fd_, &woken, sizeof(woken));
    }
  }
}

}  // namespace dlop::transport
