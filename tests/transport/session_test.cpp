// agree_session over a store that still holds what earlier attempts wrote:
// each attempt gets one id on every rank, never an earlier attempt's, whether
// the earlier attempt completed or died half-way, and whichever rank comes
// first.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "common/expect_error.hpp"
#include "common/multiprocess.hpp"
#include "core/error.hpp"
#include "transport/file_store.hpp"
#include "transport/session.hpp"

namespace dlop::transport {
namespace {

using namespace std::chrono_literals;

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// Every rank's id, gathered over the test's own bootstrap (other keys of the store).
std::vector<std::string> everyones(Bootstrap& b, const std::string& id) {
  std::vector<std::string> ids;
  for (const auto& theirs : b.allgather(bytes(id), 30s)) ids.emplace_back(theirs.begin(), theirs.end());
  return ids;
}

void expect_one_id(const std::vector<std::string>& ids) {
  for (const auto& id : ids) EXPECT_EQ(id, ids.front());
  EXPECT_EQ(ids.front().size(), 16u) << ids.front();
}

class SessionRanks : public ::testing::TestWithParam<int> {};

TEST_P(SessionRanks, EveryRankGetsOneIdAndEachAttemptANewOne) {
  const std::string dir = test::make_temp_dir();
  test::run_ranks(GetParam(), [dir](Bootstrap& b) {
    FileStore store(dir + "/jobs");
    std::vector<std::string> seen;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const auto ids = everyones(b, agree_session(store, "job", b.rank(), b.size(), 30s));
      expect_one_id(ids);
      EXPECT_EQ(std::count(seen.begin(), seen.end(), ids.front()), 0) << "attempt " << attempt << " reused an id";
      seen.push_back(ids.front());
      b.barrier(30s);
    }
  });
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Ranks, SessionRanks, ::testing::Values(1, 2, 4));

TEST(Session, LateRankZeroAfterCompletedAndAfterAbandonedAttempts) {
  const std::string dir = test::make_temp_dir();
  test::run_ranks(3, [dir](Bootstrap& b) {
    FileStore store(dir + "/jobs");
    // A complete attempt: its leader id and members stay in the store.
    const std::string first = agree_session(store, "job", b.rank(), 3, 30s);
    b.barrier(30s);
    // An attempt whose rank 0 alone arrived (the others died before joining):
    // it publishes a leader id that nobody completes.
    if (b.rank() == 0) {
      test::expect_error([&] { agree_session(store, "job", 0, 3, 300ms); }, Errc::kTimeout, "ranks [1, 2]",
                         "rank 0 alone formed a session");
    }
    b.barrier(30s);
    // The next attempts: ranks 1 and 2 first read the abandoned id, then a
    // completed one whose members do not list them; rank 0 comes late.
    std::vector<std::string> ids{first};
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (b.rank() == 0) std::this_thread::sleep_for(500ms);
      const auto now = everyones(b, agree_session(store, "job", b.rank(), 3, 30s));
      expect_one_id(now);
      EXPECT_EQ(std::count(ids.begin(), ids.end(), now.front()), 0) << "an earlier attempt's id was taken";
      ids.push_back(now.front());
      b.barrier(30s);
    }
  });
  std::filesystem::remove_all(dir);
}

TEST(Session, ARankAloneTimesOutSayingWhatItRead) {
  const std::string dir = test::make_temp_dir();
  FileStore store(dir);
  test::expect_error([&] { agree_session(store, "job", 1, 2, 200ms); }, Errc::kTimeout, "published no session id",
                     "rank 1 alone joined a session");
  // An earlier attempt of two ranks, complete; this rank 1 is of a later one.
  store.set("job/session/leader", bytes("00000000000000aa"));
  store.set("job/session/00000000000000aa/members", bytes("0000000000000001 "));
  test::expect_error([&] { agree_session(store, "job", 1, 2, 300ms); }, Errc::kTimeout,
                     "00000000000000aa, is an earlier attempt's", "rank 1 joined an earlier attempt's session");
  test::expect_error([&] { agree_session(store, "job", 2, 2, 10ms); }, Errc::kInvalidArgument, {},
                     "rank 2 of 2 accepted");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlop::transport
