// The fast path of small blocking all-reduces (scheduler/src/inline_path.cpp)
// between real processes: exact results for every size the host arena's
// boxes carry, dtypes, ops and rank counts, in and out of place; a call
// whose peers are ready allocates nothing; late peers get the round handed
// to the engine; calls behind queued ops (which skip the fast path on one
// rank but not on another) stay in step; a silent peer times the call out
// (a killed one: shm_engine_test.cpp, ShmEngineKill).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <thread>

#include "common/multiprocess.hpp"
#include "core/error.hpp"
#include "scheduler/communicator.hpp"

// Heap allocations through operator new on the calling thread. Every
// unaligned form is replaced, so that what one allocates another frees
// (sanitizers check the pairs). GCC takes the replacements' free() of what
// their malloc() returned for a mismatch once it inlines them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
thread_local std::size_t t_allocations = 0;
void* counted_malloc(std::size_t bytes) noexcept {
  ++t_allocations;
  return std::malloc(bytes == 0 ? 1 : bytes);
}
void* counted_new(std::size_t bytes) {
  if (void* p = counted_malloc(bytes)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t bytes) { return counted_new(bytes); }
void* operator new[](std::size_t bytes) { return counted_new(bytes); }
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept { return counted_malloc(bytes); }
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept { return counted_malloc(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace dlop::sched {
namespace {

using namespace std::chrono_literals;
using coll::DataType;
using coll::ReduceOp;
using Clock = std::chrono::steady_clock;

const OpOptions kBlocking{.caller_waits = true};

// Rank r's element i: small integers, so sums and products are exact in
// every dtype tested.
template <typename T>
T input(int rank, std::size_t i) {
  return static_cast<T>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 5) + 1);
}

template <typename T>
T expected(ReduceOp op, int n, std::size_t i) {
  T acc = input<T>(0, i);
  for (int r = 1; r < n; ++r) {
    const T v = input<T>(r, i);
    switch (op) {
      case ReduceOp::kSum: acc = static_cast<T>(acc + v); break;
      case ReduceOp::kProd: acc = static_cast<T>(acc * v); break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      default: ADD_FAILURE() << "op not in this test";
    }
  }
  return acc;
}

// Every count from one element to the 4 KiB the boxes carry: 1, odd, the
// last that shares the sequence number's cache line (56 B), the first that
// does not, and the largest.
template <typename T>
void check_dtype(Communicator& comm, DataType dtype) {
  const std::size_t size = sizeof(T);
  for (const std::size_t count : {std::size_t{1}, std::size_t{7}, 56 / size, 56 / size + 1, 1001 / size | 1,
                                  4096 / size}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
      for (const bool in_place : {true, false}) {
        std::vector<T> send(count), recv(count, T{0});
        for (std::size_t i = 0; i < count; ++i) send[i] = input<T>(comm.rank(), i);
        T* out = in_place ? send.data() : recv.data();
        comm.allreduce(send.data(), out, count, dtype, op, kBlocking).wait();
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[i], expected<T>(op, comm.size(), i))
              << coll::dtype_name(dtype) << " " << coll::op_name(op) << " count " << count << " at " << i
              << (in_place ? " in place" : " out of place");
        }
      }
    }
  }
}

class InlinePathRanks : public ::testing::TestWithParam<int> {};

TEST_P(InlinePathRanks, BlockingSmallAllreducesAreExact) {
  test::run_ranks(GetParam(), [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    check_dtype<float>(*comm, DataType::kFloat32);
    check_dtype<double>(*comm, DataType::kFloat64);
    check_dtype<std::int32_t>(*comm, DataType::kInt32);
    check_dtype<std::int64_t>(*comm, DataType::kInt64);
    check_dtype<std::uint8_t>(*comm, DataType::kUInt8);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, InlinePathRanks, ::testing::Values(2, 3, 4),
                         [](const auto& param_info) { return "ranks" + std::to_string(param_info.param); });

TEST(InlinePath, ACallWhosePeersAreReadyAllocatesNothing) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    float x = 1;
    comm->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, kBlocking).wait();  // algorithm chosen, cached
    // Rank 1 calls at once and waits; rank 0 comes 1 ms later and finds its
    // input posted. Timing decides only rarely otherwise (a rank descheduled
    // for the whole millisecond): the median must be none.
    std::vector<std::size_t> allocations;
    for (int k = 0; k < 100; ++k) {
      float v = static_cast<float>(comm->rank() + k);
      if (comm->rank() == 0) std::this_thread::sleep_for(1ms);
      const std::size_t before = t_allocations;
      comm->allreduce(&v, &v, 1, DataType::kFloat32, ReduceOp::kSum, kBlocking).wait();
      allocations.push_back(t_allocations - before);
      ASSERT_EQ(v, static_cast<float>(1 + 2 * k));
    }
    if (comm->rank() == 0) {
      std::nth_element(allocations.begin(), allocations.begin() + 50, allocations.end());
      EXPECT_EQ(allocations[50], 0u) << "allocations per call (median)";
    }
  });
}

TEST(InlinePath, LatePeersGetTheRoundHandedToTheEngine) {
  test::run_ranks(3, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    for (int k = 0; k < 12; ++k) {
      const int late = k % comm->size();
      std::int64_t v = comm->rank() * 100 + k;
      if (comm->rank() == late) std::this_thread::sleep_for(100ms);  // the others must still be waiting at test()
      Handle handle = comm->allreduce(&v, &v, 1, DataType::kInt64, ReduceOp::kSum, kBlocking);
      // The early ranks return before the late one has called: the handle
      // is the engine's, still running.
      if (comm->rank() != late) {
        EXPECT_FALSE(handle.test()) << "round " << k;
      }
      handle.wait();
      ASSERT_EQ(v, 300 + 3 * k) << "round " << k;
    }
  });
}

// Rank 0 always has an operation queued or running when it calls (so its
// call takes the queue), rank 1 never (so its call takes the fast path):
// both make the same arena rounds in the same order.
TEST(InlinePath, CallsBehindQueuedOperationsStayInStep) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    const std::size_t big = 300001;
    for (int k = 0; k < 40; ++k) {
      std::vector<std::int32_t> large(big, comm->rank() + k);
      std::int32_t small = comm->rank() + 10 * k;
      std::int32_t token = 0;
      const bool collective_first = k % 2 == 0;
      Handle pending;
      if (comm->rank() == 0) {
        pending = collective_first
                      ? comm->allreduce(large.data(), large.data(), big, DataType::kInt32, ReduceOp::kSum)
                      : comm->recv(&token, 1, DataType::kInt32, 1, 7);
      } else if (collective_first) {
        comm->allreduce(large.data(), large.data(), big, DataType::kInt32, ReduceOp::kSum, kBlocking).wait();
      }
      comm->allreduce(&small, &small, 1, DataType::kInt32, ReduceOp::kSum, kBlocking).wait();
      if (comm->rank() == 1 && !collective_first) {
        token = 42 + k;
        comm->send(&token, 1, DataType::kInt32, 0, 7).wait();
      }
      pending.wait();  // a default handle is done
      ASSERT_EQ(small, 1 + 20 * k) << "round " << k;
      if (collective_first) {
        ASSERT_EQ(large.front(), 1 + 2 * k);
        ASSERT_EQ(large.back(), 1 + 2 * k);
      } else if (comm->rank() == 0) {
        ASSERT_EQ(token, 42 + k);
      }
    }
  });
}

TEST(InlinePath, ASilentPeerTimesOutNamingIt) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    if (comm->rank() == 0) {
      double x = 1;
      const auto start = Clock::now();
      try {
        comm->allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum, {.timeout = 1s, .caller_waits = true}).wait();
        ADD_FAILURE() << "no timeout";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::kTimeout) << e.what();
        EXPECT_NE(std::string(e.what()).find("awaited: [1]"), std::string::npos) << e.what();
      }
      EXPECT_LT(Clock::now() - start, 10s);  // a bound, not a speed: the 1 s timeout, not a hang
    }
    b.barrier(60s);  // rank 1 calls nothing until rank 0 timed out
  });
}

}  // namespace
}  // namespace dlop::sched
