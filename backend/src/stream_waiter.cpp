#include "stream_waiter.hpp"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

namespace dlop::backend {
namespace {

void wait_without_spinning(const c10::Event& event) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kShortest = std::chrono::microseconds(20);
  constexpr auto kLongest = std::chrono::microseconds(2000);
  const auto start = Clock::now();
  try {
    while (!event.query()) {
      const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
      std::this_thread::sleep_for(std::clamp<std::chrono::microseconds>(waited / 16, kShortest, kLongest));
    }
  } catch (...) {
    // A failed device: `then` runs anyway, and the event's next query says why.
  }
}

class StreamWaiter {
 public:
  void add(std::shared_ptr<const c10::Event> event, std::function<void()> then) {
    {
      std::lock_guard lock(mutex_);
      pending_.push_back({std::move(event), std::move(then)});
    }
    wake_.notify_one();
  }

  StreamWaiter() {
    std::thread([this] { run(); }).detach();  // lives as long as the process: events may pass during exit
  }

 private:
  struct Pending {
    std::shared_ptr<const c10::Event> event;
    std::function<void()> then;
  };

  void run() {
    pthread_setname_np(pthread_self(), "dlop-streamwait");  // 15 characters: a longer name is refused
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return !pending_.empty(); });
      auto next = std::move(pending_.front());
      pending_.pop_front();
      lock.unlock();
      wait_without_spinning(*next.event);
      next.then();
      next = {};  // what `then` held goes before the thread sleeps
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
};

StreamWaiter& waiter_of(const c10::Stream& stream) {
  static std::mutex mutex;
  // Never destroyed, like their threads.
  static auto* waiters = new std::map<std::tuple<int, int, std::int64_t>, std::unique_ptr<StreamWaiter>>();
  const auto key = std::make_tuple(static_cast<int>(stream.device_type()), static_cast<int>(stream.device_index()),
                                   static_cast<std::int64_t>(stream.id()));
  std::lock_guard lock(mutex);
  auto& slot = (*waiters)[key];
  if (!slot) slot = std::make_unique<StreamWaiter>();
  return *slot;
}

}  // namespace

void when_passed(const c10::Stream& stream, std::shared_ptr<const c10::Event> event, std::function<void()> then) {
  waiter_of(stream).add(std::move(event), std::move(then));
}

}  // namespace dlop::backend
