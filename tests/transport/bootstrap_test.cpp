#include <gtest/gtest.h>

#include <filesystem>

#include "common/multiprocess.hpp"
#include "core/error.hpp"
#include "transport/file_store.hpp"

namespace dlop::transport {
namespace {

using namespace std::chrono_literals;

TEST(FileStore, GetOfMissingKeyTimesOutNamingTheKey) {
  const std::string dir = test::make_temp_dir();
  FileStore store(dir);
  const auto start = std::chrono::steady_clock::now();
  try {
    store.get("never/set", 200ms);
    FAIL() << "get of a missing key returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout);
    EXPECT_NE(std::string(e.what()).find("never/set"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
  std::filesystem::remove_all(dir);
}

TEST(FileStore, SetGetAddErase) {
  const std::string dir = test::make_temp_dir();
  FileStore store(dir);
  store.set("a/b", {1, 2, 3});
  EXPECT_EQ(store.get("a/b", 0ms), (Bytes{1, 2, 3}));
  store.set("empty", {});
  EXPECT_TRUE(store.get("empty", 0ms).empty());
  EXPECT_EQ(store.add("counter", 5), 5);
  EXPECT_EQ(store.add("counter", -2), 3);
  EXPECT_TRUE(store.erase("a/b"));
  EXPECT_FALSE(store.erase("a/b"));
  std::filesystem::remove_all(dir);
}

class BootstrapRanks : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapRanks, AllgatherAndBarrierOverFileStore) {
  test::run_ranks(GetParam(), [](Bootstrap& b) {
    for (int round = 0; round < 3; ++round) {
      const Bytes mine(static_cast<std::size_t>(b.rank() + round), static_cast<std::uint8_t>(b.rank()));
      const auto all = b.allgather(mine, 30s);
      ASSERT_EQ(all.size(), static_cast<std::size_t>(b.size()));
      for (int r = 0; r < b.size(); ++r) {
        EXPECT_EQ(all[r], Bytes(static_cast<std::size_t>(r + round), static_cast<std::uint8_t>(r)));
      }
      b.barrier(30s);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, BootstrapRanks, ::testing::Values(1, 2, 3, 4));

TEST(Bootstrap, RankThatNeverArrivesGivesTimeoutNamingIt) {
  // Three of four ranks start; the allgather must fail naming rank 3.
  const std::string dir = test::make_temp_dir();
  test::run_ranks(3, [dir](Bootstrap& three) {
    Bootstrap b(std::make_shared<FileStore>(dir), three.rank(), 4);
    try {
      b.allgather({}, 500ms);
      ADD_FAILURE() << "allgather with a missing rank returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kTimeout);
      EXPECT_NE(std::string(e.what()).find("ranks [3]"), std::string::npos) << e.what();
    }
  });
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlop::transport
