// Operations gated by a ReadyEvent (buffers a device stream is still
// filling): they start only once the event is ready, in submission order,
// and fail by their timeout when it never is.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "common/multiprocess.hpp"
#include "core/error.hpp"
#include "scheduler/communicator.hpp"

namespace dlop::sched {
namespace {

using namespace std::chrono_literals;
using coll::DataType;
using coll::ReduceOp;

// Ready once set, as a device event is once its stream passed it.
class Flag final : public ReadyEvent {
 public:
  bool ready() const override { return set_.load(); }
  std::string describe() const override { return "the test's flag"; }
  void set() { set_.store(true); }

 private:
  std::atomic<bool> set_{false};
};

TEST(ReadyEvent, GatedOpReadsItsBufferOnlyOnceReadyAndLaterOpsWaitBehindIt) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    auto flag = std::make_shared<Flag>();
    std::int64_t gated = -1;  // "not copied in yet": what a missing wait would sum
    std::int64_t behind = comm->rank() + 1;
    Handle first = comm->allreduce(&gated, &gated, 1, DataType::kInt64, ReduceOp::kSum, {.ready = flag});
    Handle second = comm->allreduce(&behind, &behind, 1, DataType::kInt64, ReduceOp::kSum);
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(first.test());
    EXPECT_FALSE(second.test()) << "an op submitted after a gated one started before it";
    gated = 10 * (comm->rank() + 1);  // the "copy" lands, then the event fires
    flag->set();
    first.wait();
    second.wait();
    EXPECT_EQ(gated, 30);
    EXPECT_EQ(behind, 3);
  });
}

TEST(ReadyEvent, EventThatNeverFiresTimesOutNamingWhatItWaitsFor) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    auto flag = std::make_shared<Flag>();
    double x = 1;
    Handle stuck = comm->allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum, {.timeout = 300ms, .ready = flag});
    try {
      stuck.wait();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kTimeout) << e.what();
      EXPECT_NE(std::string(e.what()).find("the test's flag"), std::string::npos) << e.what();
    }
  });
}

// A device event that a thread of its own sees pass: it wakes the engine,
// which must then not poll it while it waits.
class WakingFlag final : public ReadyEvent {
 public:
  bool ready() const override {
    asked_.fetch_add(1);
    return set_.load();
  }
  std::string describe() const override { return "the test's waking flag"; }
  bool notify_when_ready(std::function<void()> wake) const override {
    std::lock_guard lock(mutex_);
    if (set_.load()) {
      wake();
    } else {
      wake_ = std::move(wake);
    }
    return true;
  }
  void set() {
    std::function<void()> wake;
    {
      std::lock_guard lock(mutex_);
      set_.store(true);
      wake.swap(wake_);
    }
    if (wake) wake();
  }
  int asked() const { return asked_.load(); }

 private:
  mutable std::mutex mutex_;
  mutable std::function<void()> wake_;
  mutable std::atomic<int> asked_{0};
  std::atomic<bool> set_{false};
};

TEST(ReadyEvent, AnEventThatWakesTheEngineIsNotPolledAndItsOpStartsAtOnce) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    auto flag = std::make_shared<WakingFlag>();
    std::int64_t x = comm->rank() + 1;
    Handle gated = comm->allreduce(&x, &x, 1, DataType::kInt64, ReduceOp::kSum, {.ready = flag});
    // Nobody waits: the engine's own thread must start it. It looks a few
    // hundred times as the op arrives, then sleeps until woken.
    std::this_thread::sleep_for(100ms);
    const int asked_early = flag->asked();
    std::this_thread::sleep_for(200ms);
    const int asked_later = flag->asked() - asked_early;
    const auto set_at = std::chrono::steady_clock::now();
    flag->set();
    while (!gated.test() && std::chrono::steady_clock::now() - set_at < 5s) {
      std::this_thread::sleep_for(100us);
    }
    const auto took = std::chrono::steady_clock::now() - set_at;
    gated.wait();
    EXPECT_EQ(x, 3);
    // A polling engine asks at every pass or nap (hundreds of times in 200 ms);
    // this one only at its liveness watchdog's wake-ups.
    EXPECT_LE(asked_later, 8);
    EXPECT_LT(took, 100ms) << "the woken engine took "
                           << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  });
}

}  // namespace
}  // namespace dlop::sched
