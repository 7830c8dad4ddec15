#include "delegation.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace dlop::backend {
namespace {

struct Tracked {
  c10::intrusive_ptr<c10d::Work> work;
  std::shared_ptr<sched::DataCredits> credits;
};

// Polls works whose futures completed before they did, oldest first.
class CompletionPoller {
 public:
  static CompletionPoller& instance() {
    static auto* poller = new CompletionPoller();  // never destroyed: works may finish at exit
    return *poller;
  }
  void add(Tracked tracked) {
    {
      std::lock_guard lock(mutex_);
      pending_.push_back(std::move(tracked));
    }
    wake_.notify_one();
  }

 private:
  CompletionPoller() {
    std::thread([this] { run(); }).detach();  // lives as long as the process, like the instance
  }
  void run() {
    pthread_setname_np(pthread_self(), "dlop-delegated");
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return !pending_.empty(); });
      std::deque<Tracked> polling;
      polling.swap(pending_);
      lock.unlock();
      // A device's collectives end in order on its stream: poll the oldest,
      // sleeping between polls (a collective lasts at least tens of us).
      while (!polling.empty()) {
        if (polling.front().work->isCompleted()) {
          polling.front().credits->gradient_finished();
          polling.pop_front();
          continue;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        std::lock_guard more(mutex_);
        for (auto& t : pending_) polling.push_back(std::move(t));
        pending_.clear();
      }
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Tracked> pending_;
};

}  // namespace

void count_until_done(const c10::intrusive_ptr<c10d::Work>& work, const std::shared_ptr<sched::DataCredits>& credits) {
  credits->gradient_started();
  // The callback holds the work: a future drops its callbacks once it has run them.
  work->getFuture()->addCallback([work, credits](c10::ivalue::Future& future) {
    // A future without devices (a CPU backend's) completes when its work
    // does; a device backend's may complete when its work is queued.
    if (future.devices().empty() || work->isCompleted()) {
      credits->gradient_finished();
    } else {
      CompletionPoller::instance().add({work, credits});
    }
  });
}

}  // namespace dlop::backend
