// The engine with the intra-host arena every communicator maps when it is
// made: the tuning table's shared-memory all-reduce through the Communicator
// API (world and split communicators, many operations in flight, sizes that
// cross the protocol thresholds, whose algorithm choice the engine caches),
// and a rank killed between small all-reduces, queued and blocking.
#include <gtest/gtest.h>
#include <signal.h>

#include <deque>

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

// Element i of rank r in operation k; the sum over n ranks is exact in int32.
std::int32_t value(int rank, int k, std::size_t i) { return static_cast<std::int32_t>((i * 13 + k * 5 + rank) % 997); }
std::int32_t sum_of(int n, int k, std::size_t i) {
  std::int32_t s = 0;
  for (int r = 0; r < n; ++r) s += value(r, k, i);
  return s;
}

struct InFlight {
  Handle handle;
  std::vector<std::int32_t> send, recv;
  int k;
};

// Keeps up to `depth` all-reduces of cycling sizes in flight; checks them all.
void run_checked(Communicator& comm, int operations, std::size_t depth) {
  constexpr std::size_t kCounts[] = {1, 7, 1023, 5000, 70001, 300001, 3};
  std::deque<InFlight> flight;
  std::size_t wrong = 0;
  auto finish = [&](InFlight& f) {
    f.handle.wait();
    const bool in_place = f.recv.empty();
    const auto& got = in_place ? f.send : f.recv;
    for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != sum_of(comm.size(), f.k, i);
  };
  for (int k = 0; k < operations; ++k) {
    const std::size_t count = kCounts[static_cast<std::size_t>(k) % std::size(kCounts)];
    InFlight f{{}, std::vector<std::int32_t>(count), {}, k};
    for (std::size_t i = 0; i < count; ++i) f.send[i] = value(comm.rank(), k, i);
    if (k % 2 == 1) f.recv.assign(count, -1);
    void* out = f.recv.empty() ? static_cast<void*>(f.send.data()) : static_cast<void*>(f.recv.data());
    f.handle = comm.allreduce(f.send.data(), out, count, DataType::kInt32, ReduceOp::kSum);
    flight.push_back(std::move(f));
    if (flight.size() > depth) {
      finish(flight.front());
      flight.pop_front();
    }
  }
  for (auto& f : flight) finish(f);
  EXPECT_EQ(wrong, 0u) << "on a communicator of " << comm.size();
}

TEST(ShmEngine, WorldAndSplitCommunicatorsGiveExactResultsWithManyInFlight) {
  test::run_ranks(3, [](transport::Bootstrap& b) {
    auto world = Communicator::create(b);
    run_checked(*world, 400, 16);
    auto pair = world->split(world->rank() == 1 ? -1 : 0, world->rank());  // ranks 0 and 2
    if (pair) run_checked(*pair, 400, 16);
    run_checked(*world, 70, 1);  // blocking, one after another
  });
}

// DLOP_DEBUG=detail makes each algorithm's task only once the signatures
// matched: still in submission order, or the shm operations would pair up
// differently on different ranks.
TEST(ShmEngine, SignatureCheckedOperationsInFlightKeepTheirOrder) {
  test::run_ranks(3, [](transport::Bootstrap& b) {
    auto comm = Communicator::create(b, {.check_signatures = true});
    run_checked(*comm, 300, 16);
  });
}

// Queued, and blocking (the caller drives the round itself when the engine is
// idle: scheduler/src/inline_path.cpp).
class ShmEngineKill : public ::testing::TestWithParam<bool> {};

TEST_P(ShmEngineKill, RankKilledBetweenSmallAllreducesIsNamedAndTheCommunicatorRefusesTheNext) {
  const OpOptions options{.caller_waits = GetParam()};
  test::RankGroup group(3, [&](transport::Bootstrap& b) {
    auto comm = Communicator::create(b, {.timeout = 20s});
    float x = 1;
    comm->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, options).wait();
    ASSERT_EQ(x, 3.0f);
    b.set("ready/" + std::to_string(comm->rank()), {});
    if (comm->rank() == 2) {
      for (;;) std::this_thread::sleep_for(1s);  // alive but silent until killed
    }
    const auto start = Clock::now();
    try {
      comm->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, options).wait();
      ADD_FAILURE() << "the all-reduce finished without rank 2";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kPeerDead) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    }
    EXPECT_LT(Clock::now() - start, 15s);
    try {
      comm->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, options).wait();
      ADD_FAILURE() << "a broken communicator ran an all-reduce";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kCanceled) << e.what();
    }
  });
  transport::FileStore store(group.store_dir());
  for (int r = 0; r < 3; ++r) store.get("dlop/ready/" + std::to_string(r), 60s);
  std::this_thread::sleep_for(300ms);  // the others are waiting on rank 2's input by now
  ASSERT_EQ(::kill(group.pid(2), SIGKILL), 0);
  const auto exits = group.wait(60s);
  for (int r = 0; r < 2; ++r) {
    const auto& exit = exits[static_cast<std::size_t>(r)];
    EXPECT_TRUE(exit.exited && exit.code == 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Waits, ShmEngineKill, ::testing::Values(false, true),
                         [](const auto& param_info) { return param_info.param ? "blocking" : "queued"; });

}  // namespace
}  // namespace dlop::sched
