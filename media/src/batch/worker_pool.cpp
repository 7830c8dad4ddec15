#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "media/image_pipeline.hpp"

namespace dlop::media {

struct WorkerPool::Impl {
  std::mutex mutex;
  std::condition_variable wake;  // workers: a new loop or stop
  std::condition_variable done;  // caller: the loop finished
  std::vector<std::thread> threads;
  bool stop = false;
  std::uint64_t generation = 0;

  // The current loop.
  const std::function<void(std::size_t, std::size_t)>* fn = nullptr;
  std::size_t n = 0;
  std::atomic<std::size_t> next{0};
  std::size_t busy = 0;  // workers still inside the current loop
  std::exception_ptr error;

  void work(std::size_t worker) {
    for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      try {
        (*fn)(i, worker);
      } catch (...) {
        const std::lock_guard lock(mutex);
        if (!error) error = std::current_exception();
      }
    }
  }

  void run(std::size_t worker) {
    std::uint64_t seen = 0;
    std::unique_lock lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return stop || generation != seen; });
      if (stop) return;
      seen = generation;
      lock.unlock();
      work(worker);
      lock.lock();
      if (--busy == 0) done.notify_all();
    }
  }
};

WorkerPool::WorkerPool(std::size_t threads) : impl_(std::make_unique<Impl>()) {
  if (threads == 0) threads = 1;
  for (std::size_t w = 1; w < threads; ++w) impl_->threads.emplace_back([this, w] { impl_->run(w); });
}

WorkerPool::~WorkerPool() {
  {
    const std::lock_guard lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  for (auto& t : impl_->threads) t.join();
}

std::size_t WorkerPool::threads() const { return impl_->threads.size() + 1; }

void WorkerPool::parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn) {
  Impl& s = *impl_;
  {
    const std::lock_guard lock(s.mutex);
    s.fn = &fn;
    s.n = n;
    s.next.store(0, std::memory_order_relaxed);
    s.error = nullptr;
    s.busy = s.threads.size();
    ++s.generation;
  }
  s.wake.notify_all();
  s.work(0);
  std::unique_lock lock(s.mutex);
  s.done.wait(lock, [&] { return s.busy == 0; });
  s.fn = nullptr;
  if (s.error) std::rethrow_exception(std::exchange(s.error, nullptr));
}

}  // namespace dlop::media
