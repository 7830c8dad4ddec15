// Traffic classes in the engine: chunked all-reduces stay exact at every
// chunk boundary, more urgent collectives overtake a chunked one between its
// chunks, holding a chunked op never deadlocks, and data credits. Named
// Communicator.* so that `make test-tsan-engine` runs them under TSan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <thread>

#include "common/multiprocess.hpp"
#include "scheduler/communicator.hpp"
#include "scheduler/data_credits.hpp"

namespace dlop::sched {
namespace {

using namespace std::chrono_literals;
using coll::DataType;
using coll::ReduceOp;

constexpr std::size_t kChunkBytes = 4096;

// Rank r's element i: small integers, exact in every dtype tested.
template <typename T>
T input(int rank, std::size_t i) {
  return static_cast<T>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 23) - 11);
}

template <typename T>
T expected(ReduceOp op, int n, std::size_t i) {
  T out = input<T>(0, i);
  for (int r = 1; r < n; ++r) {
    const T x = input<T>(r, i);
    out = op == ReduceOp::kMax ? std::max(out, x) : static_cast<T>(out + x);
  }
  return out;
}

template <typename T>
void check_allreduce(Communicator& comm, DataType dtype, ReduceOp op, std::size_t count, bool in_place) {
  std::vector<T> send(count), recv(count, T(99));
  for (std::size_t i = 0; i < count; ++i) send[i] = input<T>(comm.rank(), i);
  T* out = in_place ? send.data() : recv.data();
  comm.allreduce(send.data(), out, count, dtype, op, {.traffic = TrafficClass::kBackground}).wait();
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_EQ(out[i], expected<T>(op, comm.size(), i))
        << "element " << i << " of " << count << (in_place ? " in place" : "") << ", op " << coll::op_name(op);
  }
}

TEST(Communicator, ChunkedAllreduceIsExactAtEveryChunkBoundary) {
  for (const int n : {2, 3}) {
    test::run_ranks(n, [](transport::Bootstrap& b) {
      auto comm = Communicator::create(b, {.traffic_classes = true, .chunk_bytes = kChunkBytes});
      // int32: 1024 elements per chunk; float64: 512.
      for (const std::size_t count : {0, 1, 7, 1024, 1025, 3 * 1024 + 1, 50'001}) {
        for (const bool in_place : {false, true}) {
          check_allreduce<std::int32_t>(*comm, DataType::kInt32, ReduceOp::kSum, count, in_place);
          check_allreduce<double>(*comm, DataType::kFloat64, ReduceOp::kMax, count, in_place);
        }
        check_allreduce<std::int8_t>(*comm, DataType::kInt8, ReduceOp::kMax, count * 4 + 3, false);
      }
    });
  }
}

TEST(Communicator, ChunkedAllreduceAveragesAndChecksSignaturesPerChunk) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b, {.check_signatures = true, .traffic_classes = true, .chunk_bytes = kChunkBytes});
    std::vector<float> data(10'001);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 100) + 2.0f * comm->rank();
    comm->allreduce(data.data(), data.data(), data.size(), DataType::kFloat32, ReduceOp::kAvg,
                    {.traffic = TrafficClass::kData, .deadline_step = 1})
        .wait();
    for (std::size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], static_cast<float>(i % 100) + 1.0f) << i;
  });
}

// A background all-reduce of 512 chunks, then 24 gradient all-reduces, all in
// flight at once: the background op waits between chunks while any gradient
// one runs, so it is still not done when the last gradient one is. (With 128
// chunks, under TSan, it finished first in about 1 run of 20: the gradient
// ones were still being submitted.)
TEST(Communicator, GradientAllreducesOvertakeAChunkedBackgroundOne) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b, {.traffic_classes = true, .chunk_bytes = 64u << 10});
    std::vector<std::int32_t> large(8u << 20, comm->rank() + 1);
    Handle bulk = comm->allreduce(large.data(), large.data(), large.size(), DataType::kInt32, ReduceOp::kSum,
                                  {.traffic = TrafficClass::kBackground});
    std::vector<std::vector<std::int32_t>> grads(24, std::vector<std::int32_t>(4096, comm->rank() + 1));
    std::vector<Handle> handles;
    for (auto& g : grads) handles.push_back(comm->allreduce(g.data(), g.data(), g.size(), DataType::kInt32, ReduceOp::kSum));
    for (auto& h : handles) h.wait();
    EXPECT_FALSE(bulk.test()) << "the background all-reduce finished before the gradient ones it should yield to";
    bulk.wait();
    for (auto& g : grads) ASSERT_EQ(g, std::vector<std::int32_t>(4096, 3));
    ASSERT_EQ(large, std::vector<std::int32_t>(large.size(), 3));
  });
}

// Data ops go by deadline: one due at step 2 overtakes one due at step 9
// that was submitted (and started) before it. The later op has 512 chunks:
// with 128, a rank descheduled between its two submissions on a busy
// 2-core machine let it finish first in about 1 run of 60.
TEST(Communicator, EarlierDeadlineDataAllreduceOvertakesALaterOne) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b, {.traffic_classes = true, .chunk_bytes = 64u << 10});
    std::vector<std::int32_t> later(8u << 20, 1), sooner(256u << 10, 2);
    Handle late = comm->allreduce(later.data(), later.data(), later.size(), DataType::kInt32, ReduceOp::kSum,
                                  {.traffic = TrafficClass::kData, .deadline_step = 9});
    Handle soon = comm->allreduce(sooner.data(), sooner.data(), sooner.size(), DataType::kInt32, ReduceOp::kSum,
                                  {.traffic = TrafficClass::kData, .deadline_step = 2});
    soon.wait();
    EXPECT_FALSE(late.test()) << "the batch due at step 9 finished before the one due at step 2";
    late.wait();
    ASSERT_EQ(sooner, std::vector<std::int32_t>(sooner.size(), 4));
    ASSERT_EQ(later, std::vector<std::int32_t>(later.size(), 2));
  });
}

// Rank 1 waits for the background op before it submits the gradient one;
// rank 0 submits both at once and so holds the background op for a gradient
// op rank 1 cannot reach yet. The hold is bounded: both finish.
TEST(Communicator, HoldingForAnOpAPeerHasNotSubmittedDoesNotDeadlock) {
  for (const int n : {2, 3}) {
    test::run_ranks(n, [](transport::Bootstrap& b) {
      auto comm = Communicator::create(b, {.timeout = 60s, .traffic_classes = true, .chunk_bytes = 16u << 10});
      std::vector<std::int64_t> bulk(64u << 10, 1);  // 512 KiB: 32 chunks
      std::int64_t grad = 1;
      Handle background = comm->allreduce(bulk.data(), bulk.data(), bulk.size(), DataType::kInt64, ReduceOp::kSum,
                                          {.traffic = TrafficClass::kBackground});
      if (comm->rank() == 0) {
        Handle gradient = comm->allreduce(&grad, &grad, 1, DataType::kInt64, ReduceOp::kSum);
        background.wait();
        gradient.wait();
      } else {
        background.wait();
        comm->allreduce(&grad, &grad, 1, DataType::kInt64, ReduceOp::kSum).wait();
      }
      EXPECT_EQ(grad, comm->size());
      ASSERT_EQ(bulk, std::vector<std::int64_t>(bulk.size(), comm->size()));
    });
  }
}

// DLOP_TRAFFIC_CLASSES=0: no chunking (the trace test checks that no chunk is
// recorded) and progress in submission order; results stay exact.
TEST(Communicator, TrafficClassesOffGivesExactResultsUnchunked) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b, {.traffic_classes = false, .chunk_bytes = kChunkBytes});
    std::vector<std::int32_t> large(300'001, 1);
    std::int32_t small = 5;
    Handle bulk = comm->allreduce(large.data(), large.data(), large.size(), DataType::kInt32, ReduceOp::kSum,
                                  {.traffic = TrafficClass::kBackground});
    Handle grad = comm->allreduce(&small, &small, 1, DataType::kInt32, ReduceOp::kSum);
    grad.wait();
    bulk.wait();
    EXPECT_EQ(small, 10);
    ASSERT_EQ(large, std::vector<std::int32_t>(large.size(), 2));
  });
}

TEST(Communicator, DataCreditsAreFreeWithoutGradientsAndPacedWithThem) {
  using Clock = DataCredits::Clock;
  DataCredits credits({.bytes_per_interval = 1000, .interval = 1ms, .burst = 10ms});
  const auto t0 = Clock::now();
  EXPECT_EQ(credits.acquire(1u << 30, 10, t0), 1u << 30);  // no gradient: everything
  credits.gradient_started(t0);
  credits.gradient_started(t0 + 5ms);  // a second one does not restart the accrual
  EXPECT_TRUE(credits.gradient_in_flight());
  EXPECT_EQ(credits.acquire(600, 10, t0), 0u);  // nothing saved from before the gradient
  EXPECT_EQ(credits.time_for(600, t0), 600us);
  EXPECT_EQ(credits.acquire(600, 10, t0 + 1ms), 600u);  // 1000 accrued
  EXPECT_EQ(credits.acquire(600, 10, t0 + 1ms), 400u);  // the rest of it
  EXPECT_EQ(credits.acquire(600, 10, t0 + 1500us), 500u);
  EXPECT_EQ(credits.time_for(2000, t0 + 1500us), 2000us);
  EXPECT_EQ(credits.acquire(50'000, 10, t0 + 100ms), 10'000u) << "saved up beyond the burst";
  credits.set_step(8);
  EXPECT_EQ(credits.acquire(5000, 10, t0 + 100ms), 0u);
  credits.set_step(9);
  EXPECT_EQ(credits.acquire(5000, 10, t0 + 100ms), 5000u);  // due next step: escalated
  EXPECT_EQ(credits.acquire(5000, 3, t0 + 100ms), 5000u);   // overdue
  credits.gradient_finished();
  EXPECT_TRUE(credits.gradient_in_flight());
  credits.gradient_finished();
  EXPECT_EQ(credits.acquire(5000, 100, t0 + 100ms), 5000u);
  // A new gradient starts from nothing again.
  credits.gradient_started(t0 + 200ms);
  EXPECT_EQ(credits.acquire(5000, 100, t0 + 200ms), 0u);
  credits.gradient_finished();
}

TEST(Communicator, DataCreditsWakeTheirMoversWhenTheLastGradientFinishes) {
  DataCredits credits({.bytes_per_interval = 1000, .interval = 1ms, .burst = 10ms});
  int woken = 0, other = 0;
  credits.add_waker(&woken, [&] { ++woken; });
  credits.add_waker(&other, [&] { ++other; });
  credits.gradient_started();
  credits.gradient_started();
  credits.gradient_finished();
  EXPECT_EQ(woken, 0) << "woken while a gradient still moves";
  credits.gradient_finished();
  EXPECT_EQ(woken, 1);
  credits.remove_waker(&other);
  credits.gradient_started();
  credits.gradient_finished();
  EXPECT_EQ(woken, 2);
  EXPECT_EQ(other, 1) << "a removed waker ran";
}

TEST(Communicator, DataCreditsAskOutsideGradientsOldestFirstWhenConsulted) {
  // Credit accrues so slowly that none is due by the first ask, however slow
  // the build (at 1000 B/ms, a ThreadSanitizer build had 20 B by then).
  DataCredits credits({.bytes_per_interval = 1, .interval = 1000ms, .burst = 10ms});
  bool first_ended = false, second_ended = false;
  int asked_first = 0, asked_second = 0, woken = 0;
  credits.add_waker(&woken, [&] { ++woken; });
  credits.gradient_until([&] { ++asked_first; return first_ended; });
  credits.gradient_until([&] { ++asked_second; return second_ended; });
  EXPECT_EQ(credits.gradients_in_flight(), 2);
  second_ended = true;
  EXPECT_EQ(credits.acquire(600, 10), 0u) << "granted while the first still moves";
  EXPECT_EQ(asked_second, 0) << "a later one was asked while an earlier one had not ended";
  EXPECT_EQ(credits.gradients_in_flight(), 2);
  first_ended = true;
  (void)credits.time_for(600);
  EXPECT_EQ(asked_first, 2);
  EXPECT_EQ(asked_second, 1);
  EXPECT_EQ(credits.gradients_in_flight(), 0);
  EXPECT_EQ(woken, 1) << "the movers were not woken when the last one ended";
  credits.check_outside();
  EXPECT_EQ(asked_first + asked_second, 3) << "asked again after it ended";
}

namespace {

// One training step of `credits` from `start`: the step begins (the trainer
// took its batch), then one gradient all-reduce per [from, to) offset; the
// next step begins at start + period.
void train_step(DataCredits& credits, std::uint64_t step, DataCredits::Clock::time_point start,
                std::initializer_list<std::pair<std::chrono::milliseconds, std::chrono::milliseconds>> gradients) {
  credits.set_step(step);
  for (const auto& [from, to] : gradients) {
    credits.gradient_started(start + from);
    credits.gradient_finished(start + to);
  }
}

}  // namespace

TEST(Communicator, DataCreditsHoldDataThatWouldStillMoveWhenTheNextGradientIsDue) {
  using Clock = DataCredits::Clock;
  DataCredits credits({.bytes_per_interval = 1000, .interval = 1ms, .burst = 10ms, .quiet_margin = 2ms});
  const auto t0 = Clock::now();
  // Steps 50 ms apart, the gradient moving 20-30 ms in: quiet spells of 40 ms.
  train_step(credits, 1, t0, {{20ms, 30ms}});
  EXPECT_EQ(credits.acquire(30'000, 100, t0 + 31ms), 30'000u) << "no spell seen yet: everything";
  credits.data_moved(10'000, 10ms);  // 1 byte per microsecond
  train_step(credits, 2, t0 + 50ms, {{20ms, 30ms}});
  train_step(credits, 3, t0 + 100ms, {{20ms, 30ms}});
  const auto quiet = t0 + 130ms;  // step 3's spell, predicted to end at +170 ms
  EXPECT_EQ(credits.acquire(20'000, 100, quiet), 20'000u) << "20 ms of data in a 40 ms spell";
  EXPECT_EQ(credits.acquire(20'000, 100, quiet), 0u) << "after the first, it would meet the next gradient";
  EXPECT_EQ(credits.time_for(20'000, quiet), 82ms) << "held until the spell lasts twice its longest";
  EXPECT_EQ(credits.acquire(10'000, 100, quiet + 1ms), 10'000u) << "done 8 ms before the gradient";
  EXPECT_EQ(credits.acquire(9'000, 100, quiet + 25ms), 0u) << "the link is busy until +30 ms";
  EXPECT_EQ(credits.acquire(20'000, 4, quiet + 25ms), 20'000u) << "due next step: escalated";
  EXPECT_EQ(credits.acquire(50'000, 100, quiet + 25ms), 50'000u) << "too big for any spell: it goes";
  EXPECT_EQ(credits.acquire(1'000, 100, quiet + 81ms), 0u);
  EXPECT_EQ(credits.acquire(1'000, 100, quiet + 82ms), 1'000u) << "the spell outlasted its pattern";

  // Two buckets a step: the 2 ms spell between them is predicted apart from
  // the step's long spell, and holds what the long one would carry.
  for (std::uint64_t step = 4; step < 8; ++step) {
    train_step(credits, step, t0 + step * 50ms, {{20ms, 25ms}, {27ms, 30ms}});
  }
  const auto step8 = t0 + 400ms;
  train_step(credits, 8, step8, {{20ms, 25ms}});
  EXPECT_EQ(credits.acquire(5'000, 100, step8 + 25ms), 0u) << "between the buckets";
  credits.gradient_started(step8 + 27ms);
  credits.gradient_finished(step8 + 30ms);
  EXPECT_EQ(credits.acquire(5'000, 100, step8 + 30ms), 5'000u) << "the long spell after the last bucket";
}

// The engine counts its gradient collectives in flight for the credits.
TEST(Communicator, EngineReportsGradientTrafficToDataCredits) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    DataCredits& credits = *comm->data_credits();
    EXPECT_FALSE(credits.gradient_in_flight());
    std::int32_t x = 1;
    if (comm->rank() == 0) {
      Handle h = comm->allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum);
      // Rank 1 submits only after the store says so: it is surely in flight here.
      for (int i = 0; i < 1000 && !credits.gradient_in_flight(); ++i) std::this_thread::sleep_for(1ms);
      EXPECT_TRUE(credits.gradient_in_flight());
      b.set("submitted", {});
      h.wait();
    } else {
      b.get("submitted", 30s);
      comm->allreduce(&x, &x, 1, DataType::kInt32, ReduceOp::kSum).wait();
    }
    for (int i = 0; i < 1000 && credits.gradient_in_flight(); ++i) std::this_thread::sleep_for(1ms);
    EXPECT_FALSE(credits.gradient_in_flight());
    std::int32_t y = 1;
    comm->allreduce(&y, &y, 1, DataType::kInt32, ReduceOp::kSum, {.traffic = TrafficClass::kData}).wait();
    EXPECT_FALSE(credits.gradient_in_flight());
    EXPECT_EQ(x, 2);
  });
}

}  // namespace
}  // namespace dlop::sched
