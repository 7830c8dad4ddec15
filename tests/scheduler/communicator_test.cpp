// The engine through the Communicator API: ordering, concurrency, timeouts,
// misuse and dead ranks. Algorithm correctness is tested in tests/collectives.
#include <gtest/gtest.h>
#include <signal.h>

#include <deque>
#include <numeric>
#include <random>
#include <thread>

#include "common/expect_error.hpp"
#include "common/multiprocess.hpp"
#include "core/error.hpp"
#include "scheduler/communicator.hpp"
#include "transport/file_store.hpp"

namespace dlop::sched {
namespace {

using namespace std::chrono_literals;
using coll::DataType;
using coll::ReduceOp;
using Clock = std::chrono::steady_clock;

using test::expect_error;

TEST(Communicator, AllreduceAndBroadcastGiveExactResults) {
  for (const int n : {1, 2, 3, 4}) {
    test::run_ranks(n, [](transport::Bootstrap& b) {
      auto comm = Communicator::create(b);
      std::vector<std::int64_t> data(1001);
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::int64_t>(i) * (comm->rank() + 1);
      comm->allreduce(data.data(), data.data(), data.size(), DataType::kInt64, ReduceOp::kSum).wait();
      const std::int64_t ranks_sum = comm->size() * (comm->size() + 1) / 2;
      for (std::size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], static_cast<std::int64_t>(i) * ranks_sum);
      std::vector<float> value(3, static_cast<float>(comm->rank()));
      comm->broadcast(value.data(), value.size(), DataType::kFloat32, comm->size() - 1).wait();
      EXPECT_EQ(value, std::vector<float>(3, static_cast<float>(comm->size() - 1)));
      comm->barrier().wait();
    });
  }
}

TEST(Communicator, UnsupportedReductionIsRejectedBeforeAnyCommunication) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    float x = 1;
    const Error e = expect_error([&] { comm->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kBxor); },
                                 Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("bxor"), std::string::npos) << e.what();
    expect_error([&] { comm->broadcast(&x, 1, DataType::kFloat32, 2); }, Errc::kInvalidArgument);
    // Nothing was sent: the next operation still pairs up across ranks.
    comm->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum).wait();
    EXPECT_EQ(x, 2.0f);
  });
}

TEST(Communicator, TimeoutNamesTheOperationAndTheSilentRank) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    if (comm->rank() == 0) {
      double x = 1;
      const auto start = Clock::now();
      const Error e = expect_error(
          [&] { comm->allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum, {.timeout = 500ms}).wait(); },
          Errc::kTimeout);
      EXPECT_LT(Clock::now() - start, 5s);
      const std::string what = e.what();
      EXPECT_NE(what.find("allreduce #0"), std::string::npos) << what;
      EXPECT_NE(what.find("[1]"), std::string::npos) << what;
    }
    b.barrier(30s);  // rank 1 submits nothing until rank 0 has timed out
  });
}

TEST(Communicator, SmallOperationIsNotStuckBehindALargeOne) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b);
    std::vector<float> large(64u << 20, 1.0f);
    float small = 1;
    Handle big = comm->allreduce(large.data(), large.data(), large.size(), DataType::kFloat32, ReduceOp::kSum);
    Handle little = comm->allreduce(&small, &small, 1, DataType::kFloat32, ReduceOp::kSum);
    little.wait();
    EXPECT_FALSE(big.test()) << "the 256 MiB all-reduce finished before the 4-byte one";
    big.wait();
    EXPECT_EQ(small, 2.0f);
    EXPECT_EQ(large.front(), 2.0f);
    EXPECT_EQ(large.back(), 2.0f);
  });
}

// Two threads per rank, each on its own communicator, keep up to 8 random
// collectives in flight: 1000 in all per rank, every result checked.
TEST(Communicator, ThousandMixedCollectivesFromTwoThreads) {
  test::run_ranks(3, [](transport::Bootstrap& b) {
    auto world = Communicator::create(b);
    auto second = world->split(0, world->rank());
    ASSERT_TRUE(second);
    auto worker = [](Communicator& comm, unsigned seed) {
      std::mt19937 random(seed);  // same seed on every rank: same sequence of ops
      struct InFlight { Handle handle; std::vector<std::int32_t> data; int kind; std::size_t count; };
      std::deque<InFlight> flight;
      auto check = [&](InFlight& f) {
        f.handle.wait();
        const int n = comm.size();
        for (std::size_t i = 0; i < f.count; ++i) {
          const auto index = static_cast<std::int32_t>(i);
          if (f.kind == 0) {
            ASSERT_EQ(f.data[i], index * n * (n - 1) / 2) << "allreduce of rank * i, index " << i;
          } else if (f.kind == 1) {
            ASSERT_EQ(f.data[i], index + 7) << "broadcast from rank 0, index " << i;
          } else {
            for (int r = 0; r < n; ++r) ASSERT_EQ(f.data[static_cast<std::size_t>(r) * f.count + i], r) << "allgather";
          }
        }
      };
      for (int op = 0; op < 500; ++op) {
        const int kind = static_cast<int>(random() % 3);
        const std::size_t count = random() % 3 == 0 ? random() % 70000 : random() % 64;
        InFlight f{{}, {}, kind, count};
        const int me = comm.rank();
        if (kind == 0) {
          f.data.resize(count);
          for (std::size_t i = 0; i < count; ++i) f.data[i] = static_cast<std::int32_t>(i) * me;
          f.handle = comm.allreduce(f.data.data(), f.data.data(), count, DataType::kInt32, ReduceOp::kSum);
        } else if (kind == 1) {
          f.data.assign(count, -1);
          if (me == 0) std::iota(f.data.begin(), f.data.end(), 7);
          f.handle = comm.broadcast(f.data.data(), count, DataType::kInt32, 0);
        } else {
          f.data.resize(count * static_cast<std::size_t>(comm.size()));
          std::fill_n(f.data.begin() + static_cast<std::ptrdiff_t>(count * static_cast<std::size_t>(me)), count, me);
          f.handle = comm.allgather(f.data.data() + count * static_cast<std::size_t>(me), f.data.data(), count,
                                    DataType::kInt32);
        }
        flight.push_back(std::move(f));
        if (flight.size() > 8) {
          check(flight.front());
          flight.pop_front();
        }
      }
      for (auto& f : flight) check(f);
    };
    std::thread other([&] { worker(*second, 2); });
    worker(*world, 1);
    other.join();
  });
}

TEST(Communicator, MismatchedOperationsAreReportedInDetailMode) {
  test::run_ranks(2, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b, {.timeout = 20s, .check_signatures = true});
    std::vector<float> data(16, 1.0f);
    const std::size_t count = comm->rank() == 0 ? 16 : 8;
    const Error e = expect_error(
        [&] { comm->allreduce(data.data(), data.data(), count, DataType::kFloat32, ReduceOp::kSum).wait(); },
        Errc::kInvalidArgument);
    const std::string what = e.what();
    EXPECT_NE(what.find("mismatched"), std::string::npos) << what;
    EXPECT_NE(what.find("16 x float"), std::string::npos) << what;
    EXPECT_NE(what.find("8 x float"), std::string::npos) << what;
  });
}

TEST(Communicator, RankKilledMidAllreduceIsNamedWithinTheTimeout) {
  test::RankGroup group(3, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b, {.timeout = 20s});
    std::vector<float> data(32u << 20, 1.0f);
    b.set("ready/" + std::to_string(comm->rank()), {});
    if (comm->rank() == 2) {
      for (;;) comm->allreduce(data.data(), data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    }
    const Error e = expect_error(
        [&] {
          for (;;) comm->allreduce(data.data(), data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum).wait();
        },
        Errc::kPeerDead);
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    // The communicator refuses further collectives instead of hanging.
    float x = 1;
    expect_error([&] { comm->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum).wait(); }, Errc::kCanceled);
  });
  transport::FileStore store(group.store_dir());
  for (int r = 0; r < 3; ++r) store.get("dlop/ready/" + std::to_string(r), 60s);
  std::this_thread::sleep_for(300ms);
  ASSERT_EQ(::kill(group.pid(2), SIGKILL), 0);
  const auto killed = Clock::now();
  const auto exits = group.wait(60s);
  EXPECT_LT(Clock::now() - killed, 20s);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(exits[static_cast<std::size_t>(r)].exited && exits[static_cast<std::size_t>(r)].code == 0) << "rank " << r;
}

}  // namespace
}  // namespace dlop::sched
