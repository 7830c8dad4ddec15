#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "common/multiprocess.hpp"
#include "core/error.hpp"
#include "transport/shm_flag.hpp"
#include "transport/shm_segment.hpp"

namespace dlop::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Unique per test and per test process, so parallel runs never share a name.
std::string unique_name(const std::string& tag = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return fmt::format("test-{}-{}{}{}", info->name(), ::getpid(), tag.empty() ? "" : "-", tag);
}

bool exists(const std::string& name) { return std::filesystem::exists(ShmSegment::path_of(name)); }

std::byte pattern(int rank, int round, std::size_t i) {
  return static_cast<std::byte>(rank * 31 + round * 7 + i % 251);
}

template <typename Body>
void expect_error(Errc code, const std::string& needle, Body body) {
  try {
    body();
    ADD_FAILURE() << "no dlop::Error thrown; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ShmSegment, CreateOpenAndUnlinkInOneProcess) {
  const std::string name = unique_name();
  ShmSegment created = ShmSegment::create(name, 1000);
  EXPECT_TRUE(created.is_creator());
  EXPECT_EQ(created.size(), 1000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(created.data()) % 64, 0u);
  EXPECT_TRUE(created.creator() == ProcessId::self());
  for (std::size_t i = 0; i < created.size(); ++i) ASSERT_EQ(created.data()[i], std::byte{0}) << i;

  ShmSegment opened = ShmSegment::open(name, 1s);
  EXPECT_FALSE(opened.is_creator());
  EXPECT_EQ(opened.size(), 1000u);
  EXPECT_NE(opened.data(), created.data());
  std::memset(created.data(), 0x5a, created.size());
  EXPECT_EQ(opened.data()[999], std::byte{0x5a});

  EXPECT_TRUE(exists(name));
  created.unlink();
  created.unlink();  // idempotent
  EXPECT_TRUE(created.unlinked());
  EXPECT_FALSE(exists(name));
  opened.data()[0] = std::byte{1};  // both mappings outlive the name
  EXPECT_EQ(created.data()[0], std::byte{1});

  ShmSegment moved = std::move(opened);
  EXPECT_EQ(moved.data()[0], std::byte{1});
}

TEST(ShmSegment, CreatorDestructorUnlinks) {
  const std::string name = unique_name();
  {
    ShmSegment segment = ShmSegment::create(name, 64);
    EXPECT_TRUE(exists(name));
  }
  EXPECT_FALSE(exists(name));
}

TEST(ShmSegment, RejectsZeroSizeAndBadNames) {
  expect_error(Errc::kInvalidArgument, "size", [] { ShmSegment::create(unique_name(), 0); });
  expect_error(Errc::kInvalidArgument, "name", [] { ShmSegment::create("a/b", 64); });
  expect_error(Errc::kInvalidArgument, "name", [] { ShmSegment::open("", 0ms); });
}

TEST(ShmSegment, OpenOfMissingNameTimesOutNamingIt) {
  const std::string name = unique_name();
  const auto start = Clock::now();
  expect_error(Errc::kTimeout, name, [&] { ShmSegment::open(name, 200ms); });
  EXPECT_GE(Clock::now() - start, 200ms);
}

TEST(ShmSegment, FullShmGivesClearErrorAndLeavesNothing) {
  struct statvfs fs {};
  ASSERT_EQ(::statvfs("/dev/shm", &fs), 0);
  if (fs.f_blocks == 0) GTEST_SKIP() << "/dev/shm has no size limit";
  // More than the whole file system: tmpfs refuses at once, without allocating.
  const std::size_t bytes = 2 * static_cast<std::size_t>(fs.f_blocks) * fs.f_frsize;
  const std::string name = unique_name();
  expect_error(Errc::kSystem, ShmSegment::path_of(name), [&] { ShmSegment::create(name, bytes); });
  EXPECT_FALSE(exists(name));
}

TEST(ShmSegment, ForeignFileIsNeitherOpenedNorRemoved) {
  const std::string name = unique_name();
  const std::string shm = std::string("/") + ShmSegment::kPrefix + name;
  const int fd = ::shm_open(shm.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  const std::string junk(ShmSegment::kHeaderBytes, 'x');
  ASSERT_EQ(::write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  ::close(fd);

  expect_error(Errc::kProtocol, "not a dlop", [&] { ShmSegment::open(name, 1s); });
  ShmSegment::remove_stale_segments();
  EXPECT_TRUE(exists(name));
  expect_error(Errc::kInvalidArgument, "not a dlop", [&] { ShmSegment::create(name, 64); });
  ::shm_unlink(shm.c_str());
}

TEST(ShmSegment, NameCollisionWithLiveCreatorIsAnError) {
  const std::string name = unique_name();
  test::run_ranks(2, [&](Bootstrap& b) {
    std::optional<ShmSegment> segment;
    if (b.rank() == 0) segment.emplace(ShmSegment::create(name, 64));
    b.barrier(10s);
    if (b.rank() == 1) expect_error(Errc::kInvalidArgument, "collision", [&] { ShmSegment::create(name, 64); });
    b.barrier(10s);
  });
  EXPECT_FALSE(exists(name));
}

TEST(ShmSegment, CreateSharedReportsCreatorFailureToOthers) {
  const std::string name = unique_name();
  const ShmSegment squatter = ShmSegment::create(name, 64);  // alive: rank 0 cannot create
  test::run_ranks(2, [&](Bootstrap& b) {
    const auto start = Clock::now();
    if (b.rank() == 0) {
      expect_error(Errc::kInvalidArgument, "collision",
                   [&] { ShmSegment::create_shared(b, {0, 1}, name, 64, 10s); });
    } else {
      expect_error(Errc::kTransport, "creator rank 0",
                   [&] { ShmSegment::create_shared(b, {0, 1}, name, 64, 10s); });
    }
    EXPECT_LT(Clock::now() - start, 5s);  // told, not timed out
  });
}

// Two flag arrays: "written" (slice of round r is complete) and "read" (every
// slice of round r has been checked, so it may be overwritten).
TEST(ShmSegment, FourRanksWriteSlicesAndWaitForEachOthersFlags) {
  constexpr int kRanks = 4;
  constexpr int kRounds = 3;
  constexpr std::size_t kSlice = 4096 + 64;
  const std::string name = unique_name();
  test::run_ranks(kRanks, [&](Bootstrap& b) {
    const std::vector<int> local{0, 1, 2, 3};
    ShmSegment segment = ShmSegment::create_shared(b, local, name, 2 * shm_flags_bytes(kRanks) + kRanks * kSlice, 10s);
    if (b.rank() == 0) {
      EXPECT_TRUE(segment.is_creator());
      EXPECT_TRUE(segment.unlinked());
      EXPECT_FALSE(exists(name));
    }
    const auto written = shm_flags_at(segment, 0, kRanks);
    const auto read = shm_flags_at(segment, shm_flags_bytes(kRanks), kRanks);
    std::byte* slices = segment.data() + 2 * shm_flags_bytes(kRanks);
    const auto deadline = Clock::now() + 10s;
    const auto no_check = [] {};
    for (int round = 0; round < kRounds; ++round) {
      const auto seq = static_cast<std::uint64_t>(round);
      for (const ShmFlag& flag : read) flag.wait_at_least(seq, deadline, no_check, "read flag");
      std::byte* mine = slices + static_cast<std::size_t>(b.rank()) * kSlice;
      for (std::size_t i = 0; i < kSlice; ++i) mine[i] = pattern(b.rank(), round, i);
      written[static_cast<std::size_t>(b.rank())].post(seq + 1);
      for (const ShmFlag& flag : written) flag.wait_at_least(seq + 1, deadline, no_check, "written flag");
      for (int r = 0; r < kRanks; ++r) {
        const std::byte* theirs = slices + static_cast<std::size_t>(r) * kSlice;
        for (std::size_t i = 0; i < kSlice; ++i) {
          ASSERT_EQ(theirs[i], pattern(r, round, i)) << "rank " << r << " round " << round << " byte " << i;
        }
      }
      read[static_cast<std::size_t>(b.rank())].post(seq + 1);
    }
  });
  EXPECT_FALSE(exists(name));
}

TEST(ShmSegment, CreateSharedOverASubsetOfRanks) {
  const std::string name = unique_name();
  test::run_ranks(3, [&](Bootstrap& b) {
    if (b.rank() == 0) return;  // another host, say
    ShmSegment segment = ShmSegment::create_shared(b, {2, 1}, name, 128, 10s);
    EXPECT_EQ(segment.is_creator(), b.rank() == 2);
    const auto flags = shm_flags_at(segment, 0, 2);
    flags[static_cast<std::size_t>(b.rank() - 1)].post(7);
    for (const ShmFlag& flag : flags) flag.wait_at_least(7, Clock::now() + 10s, {});
  });
  EXPECT_FALSE(exists(name));
}

TEST(ShmSegment, CreatorKilledAfterMappingLeavesMappingUsableAndNoFile) {
  const std::string name = unique_name();
  test::RankGroup group(3, [&](Bootstrap& b) {
    ShmSegment segment = ShmSegment::create_shared(b, {0, 1, 2}, name, 4096, 10s);
    const auto flags = shm_flags_at(segment, 0, 3);
    if (b.rank() == 0) {
      std::memset(segment.data() + 1024, 0x42, 1024);
      flags[0].post(1);
      ::raise(SIGKILL);
    }
    const auto deadline = Clock::now() + 10s;
    flags[0].wait_at_least(1, deadline, {});
    while (segment.creator().alive()) {
      ASSERT_LT(Clock::now(), deadline) << "rank 0 did not die";
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_FALSE(exists(name));
    for (std::size_t i = 1024; i < 2048; ++i) ASSERT_EQ(segment.data()[i], std::byte{0x42}) << i;
    flags[static_cast<std::size_t>(b.rank())].post(2);
    flags[static_cast<std::size_t>(3 - b.rank())].wait_at_least(2, deadline, {});
  });
  const auto exits = group.wait(30s);
  EXPECT_FALSE(exits[0].exited);
  EXPECT_EQ(exits[0].code, SIGKILL);
  for (int r = 1; r < 3; ++r) EXPECT_TRUE(exits[r].exited && exits[r].code == 0) << "rank " << r;
  EXPECT_FALSE(exists(name));
}

// Leaves /dev/shm/dlop-<name> behind as a creator killed before unlinking
// would. A blocking waitpid, so that the caller sees it as early as possible.
void create_and_die(const std::string& name) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      ShmSegment segment = ShmSegment::create(name, 4096);
      ::raise(SIGKILL);
    } catch (...) {
    }
    std::_Exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

TEST(ShmSegment, StaleSegmentOfKilledCreatorIsRemoved) {
  const std::string name = unique_name();
  // A parallel test process's create() may remove it first; then count again.
  bool counted = false;
  for (int attempt = 0; attempt < 20 && !counted; ++attempt) {
    create_and_die(name);
    const bool left_behind = exists(name);
    counted = left_behind && ShmSegment::remove_stale_segments() >= 1;
    EXPECT_FALSE(exists(name));
  }
  EXPECT_TRUE(counted) << "remove_stale_segments() never reported a removal";
  ShmSegment fresh = ShmSegment::create(name, 64);
  EXPECT_TRUE(fresh.creator() == ProcessId::self());

  // create() of any name cleans up too.
  const std::string other = unique_name("other");
  create_and_die(other);
  ShmSegment unrelated = ShmSegment::create(unique_name("unrelated"), 64);
  EXPECT_FALSE(exists(other));
}

TEST(ShmSegment, OpenIgnoresStaleSegmentAndTimesOut) {
  const std::string name = unique_name();
  create_and_die(name);
  if (!exists(name)) GTEST_SKIP() << "removed by a parallel test";
  try {
    ShmSegment::open(name, 100ms);
    ADD_FAILURE() << "opened a stale segment";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find(name), std::string::npos) << what;
    // Unless a parallel test's create() removed it meanwhile, the error says why.
    EXPECT_TRUE(what.find("is dead") != std::string::npos || what.find("does not exist") != std::string::npos)
        << what;
  }
  ShmSegment::remove_stale_segments();
}

TEST(ShmFlag, WaitReturnsOncePosted) {
  ShmFlag flag;
  flag.post(5);
  EXPECT_EQ(flag.load(), 5u);
  EXPECT_EQ(flag.wait_at_least(3, Clock::now(), {}), 5u);

  std::thread poster([&] {
    std::this_thread::sleep_for(20ms);
    flag.post(9);
  });
  EXPECT_EQ(flag.wait_at_least(9, Clock::now() + 10s, {}), 9u);
  poster.join();
}

TEST(ShmFlag, WaitTimesOutAndCallsCheck) {
  ShmFlag flag;
  int checks = 0;
  const auto start = Clock::now();
  expect_error(Errc::kTimeout, "my flag", [&] { flag.wait_at_least(1, start + 100ms, [&] { ++checks; }, "my flag"); });
  EXPECT_GE(Clock::now() - start, 100ms);
  EXPECT_GE(checks, 3);  // every 2 ms when the machine is idle; fewer under load

  const auto dead_peer = [] { throw_error(Errc::kPeerDead, "peer 3 died"); };
  expect_error(Errc::kPeerDead, "peer 3", [&] { flag.wait_at_least(1, Clock::now() + 10s, dead_peer); });
}

TEST(ShmFlag, FlagsAtChecksBoundsAndAlignment) {
  ShmSegment segment = ShmSegment::create(unique_name(), 256);
  EXPECT_EQ(shm_flags_at(segment, 0, 4).size(), 4u);
  EXPECT_EQ(shm_flags_at(segment, 192, 1)[0].load(), 0u);
  expect_error(Errc::kInvalidArgument, "do not fit", [&] { shm_flags_at(segment, 0, 5); });
  expect_error(Errc::kInvalidArgument, "multiple of 64", [&] { shm_flags_at(segment, 32, 1); });
  expect_error(Errc::kInvalidArgument, "do not fit", [&] { shm_flags_at(segment, 512, 0); });
}

}  // namespace
}  // namespace dlop::transport
