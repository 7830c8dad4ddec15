// Runs under mpirun (several ranks; main initialises MPI) and as a singleton
// with --dlop-self-init (main leaves MPI alone, so MpiBootstrap initialises it
// and must finalise it when destroyed).
#include "transport/mpi_bootstrap.hpp"

#include <gtest/gtest.h>  // mpi.h comes through mpi_bootstrap.hpp, C API only

#include <cstring>
#include <iostream>
#include <thread>

#include "core/error.hpp"

namespace dlop::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool g_self_init = false;

// One bootstrap shared by the tests, created by the first that needs it.
std::unique_ptr<MpiBootstrap>& shared_slot() {
  static std::unique_ptr<MpiBootstrap> slot;
  return slot;
}

MpiBootstrap& bootstrap() {
  if (!shared_slot()) shared_slot() = std::make_unique<MpiBootstrap>(10s, "test");
  return *shared_slot();
}

Bytes contribution(int rank, int round) {
  // Rank 0 gives nothing; the last rank gives 1 MiB.
  Bytes b(rank == 0 ? 0 : static_cast<std::size_t>(rank) * 1000 + static_cast<std::size_t>(round));
  if (rank > 0 && rank == bootstrap().size() - 1) b.resize(1 << 20);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(i * 7 + static_cast<std::size_t>(rank));
  return b;
}

TEST(MpiBootstrap, RankAndSizeComeFromMpiWorld) {
  MpiBootstrap& b = bootstrap();
  int rank = -1;
  int size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(b.rank(), rank);
  EXPECT_EQ(b.size(), size);
  int relation = MPI_UNEQUAL;
  MPI_Comm_compare(b.comm(), MPI_COMM_WORLD, &relation);
  EXPECT_EQ(relation, MPI_CONGRUENT) << "comm() should be a duplicate of MPI_COMM_WORLD";
}

TEST(MpiBootstrap, AllgatherWithDifferentSizesPerRank) {
  MpiBootstrap& b = bootstrap();
  for (int round = 0; round < 3; ++round) {
    const auto all = b.allgather(contribution(b.rank(), round), 10s);
    ASSERT_EQ(all.size(), static_cast<std::size_t>(b.size()));
    for (int r = 0; r < b.size(); ++r) EXPECT_EQ(all[r], contribution(r, round)) << "rank " << r << " round " << round;
  }
  const auto empty = b.allgather({}, 10s);
  EXPECT_EQ(empty, std::vector<Bytes>(static_cast<std::size_t>(b.size())));
}

TEST(MpiBootstrap, BarrierWaitsForEveryRank) {
  MpiBootstrap& b = bootstrap();
  std::this_thread::sleep_for(std::chrono::milliseconds(50 * b.rank()));  // arrive in turn
  b.set(fmt::format("arrived/{}", b.rank()), {1});
  b.barrier(10s);
  for (int r = 0; r < b.size(); ++r) {
    EXPECT_NO_THROW(b.get(fmt::format("arrived/{}", r), 0ms)) << "rank " << r << " was not there before the barrier";
  }
}

TEST(MpiBootstrap, SetAndGetBetweenRanks) {
  MpiBootstrap& b = bootstrap();
  const int next = (b.rank() + 1) % b.size();
  b.set(fmt::format("from/{}", b.rank()), contribution(b.rank(), 5));
  EXPECT_EQ(b.get(fmt::format("from/{}", next), 10s), contribution(next, 5));  // waits on the server if need be
  // The store is shared: add() from every rank gives the exact total.
  const auto [host, port] = parse_host_port(b.store_address());
  TcpStoreClient direct(host, port, 5s);
  for (int i = 0; i < 10; ++i) direct.add("count", b.rank() + 1);
  b.barrier(10s);
  EXPECT_EQ(direct.add("count", 0), 10 * b.size() * (b.size() + 1) / 2);
  b.barrier(10s);
}

TEST(MpiBootstrap, GetOfMissingKeyTimesOutNamingTheKey) {
  MpiBootstrap& b = bootstrap();
  const std::string key = fmt::format("missing/{}", b.rank());
  const auto start = Clock::now();
  try {
    b.get(key, 300ms);
    ADD_FAILURE() << "get of a missing key returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout);
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, 300ms);
  EXPECT_LT(Clock::now() - start, 2s);
  b.barrier(10s);
}

TEST(MpiBootstrap, LeavesTheCallersMpiInitialised) {
  if (g_self_init) GTEST_SKIP() << "MPI is the bootstrap's own in this run";
  {
    MpiBootstrap second(10s, "second");
    EXPECT_EQ(second.allgather(Bytes{static_cast<std::uint8_t>(second.rank())}, 10s).size(),
              static_cast<std::size_t>(second.size()));
  }
  int finalized = 1;
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 0);
}

}  // namespace
}  // namespace dlop::transport

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dlop-self-init") == 0) dlop::transport::g_self_init = true;
  }
  if (!dlop::transport::g_self_init) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  }
  int rc = RUN_ALL_TESTS();
  const bool had_bootstrap = dlop::transport::shared_slot() != nullptr;
  dlop::transport::shared_slot().reset();  // collective
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (dlop::transport::g_self_init && had_bootstrap && finalized == 0) {
    std::cerr << "MpiBootstrap initialised MPI but did not finalise it" << std::endl;
    rc = 1;
  }
  if (!dlop::transport::g_self_init) {
    if (finalized != 0) {
      std::cerr << "MpiBootstrap finalised an MPI it did not initialise" << std::endl;
      rc = 1;
    }
    MPI_Finalize();
  }
  return rc;
}
