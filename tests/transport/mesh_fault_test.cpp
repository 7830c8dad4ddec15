// Dead and missing peers: errors naming the peer within the timeout, never a hang.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <thread>

#include "common/multiprocess.hpp"
#include "core/error.hpp"
#include "transport/file_store.hpp"
#include "transport/mesh.hpp"

namespace dlop::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kLarge = 64u << 20;
constexpr auto kOpTimeout = 10s;

// Expects `op` to throw kPeerDead naming rank `dead`.
template <typename Op>
void expect_peer_dead(Op&& op, int dead, const char* what) {
  try {
    op();
    ADD_FAILURE() << what << " succeeded toward dead rank " << dead;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kPeerDead) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(dead)), std::string::npos) << e.what();
  }
}

// Rank 2 streams 64 MiB messages: it receives from rank 0 and sends to rank 1.
// The test kills it mid-stream; ranks 0 and 1 must see it die, then still talk
// to each other and exit cleanly.
void stream_until_killed(Bootstrap& b, const std::string& host_of_rank2) {
  Mesh::Options options;
  options.timeout = kOpTimeout;
  options.watchdog = 50ms;
  options.host = b.rank() == 2 ? host_of_rank2 : "host-a";
  UcxWorker worker;
  Mesh mesh(worker, b, options);
  std::vector<std::uint8_t> buffer(kLarge, static_cast<std::uint8_t>(b.rank()));
  if (b.rank() == 2) {
    b.set("streaming", {});
    for (;;) {
      Request in = mesh.recv(0, buffer.data(), kLarge, 1);
      Request out = mesh.send(1, buffer.data(), kLarge, 2);
      in.wait(kOpTimeout);
      out.wait(kOpTimeout);
    }
  }
  const auto start = Clock::now();
  expect_peer_dead(
      [&] {
        for (;;) {
          if (b.rank() == 0) mesh.send(2, buffer.data(), kLarge, 1).wait(kOpTimeout);
          else mesh.recv(2, buffer.data(), kLarge, 2).wait(kOpTimeout);
        }
      },
      2, "streaming");
  EXPECT_LT(Clock::now() - start, 60s);
  EXPECT_TRUE(mesh.peer_failure(2).has_value());
  // Later operations toward the dead rank fail at once.
  expect_peer_dead([&] { mesh.send(2, buffer.data(), 1, 3).wait(1s); }, 2, "send after death");
  expect_peer_dead([&] { mesh.recv(2, buffer.data(), 1, 3).wait(1s); }, 2, "recv after death");
  // The survivors still talk.
  const int other = 1 - b.rank();
  std::uint64_t value = 0;
  const std::uint64_t mine = 1000 + static_cast<std::uint64_t>(b.rank());
  Request r = mesh.recv(other, &value, sizeof(value), 4);
  mesh.send(other, &mine, sizeof(mine), 4).wait(kOpTimeout);
  r.wait(kOpTimeout);
  EXPECT_EQ(value, 1000u + static_cast<std::uint64_t>(other));
}

void kill_rank2_mid_stream(const std::string& host_of_rank2) {
  test::RankGroup group(3, [host_of_rank2](Bootstrap& b) { stream_until_killed(b, host_of_rank2); });
  FileStore store(group.store_dir());
  store.get("dlop/streaming", 60s);
  std::this_thread::sleep_for(300ms);  // let a few 64 MiB messages go by
  ASSERT_EQ(::kill(group.pid(2), SIGKILL), 0);
  const auto killed = Clock::now();
  const auto exits = group.wait(kOpTimeout + 20s);
  // The survivors noticed well within the operation timeout.
  EXPECT_LT(Clock::now() - killed, kOpTimeout);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(exits[static_cast<std::size_t>(rank)].exited) << "rank " << rank << " was killed: it hung";
    EXPECT_EQ(exits[static_cast<std::size_t>(rank)].code, 0) << "rank " << rank;
  }
  EXPECT_FALSE(exits[2].exited);
}

TEST(MeshFaults, LocalPeerKilledMidTransferIsReportedByTheWatchdog) { kill_rank2_mid_stream("host-a"); }

TEST(MeshFaults, RemotePeerKilledMidTransferIsReportedByUcx) { kill_rank2_mid_stream("host-b"); }

TEST(MeshFaults, RankThatNeverJoinsGivesTimeoutNamingIt) {
  const std::string dir = test::make_temp_dir();
  test::run_ranks(2, [dir](Bootstrap& two) {
    Bootstrap b(std::make_shared<FileStore>(dir), two.rank(), 3);
    Mesh::Options options;
    options.timeout = 500ms;
    UcxWorker worker;
    const auto start = Clock::now();
    try {
      Mesh mesh(worker, b, options);
      ADD_FAILURE() << "a mesh formed without rank 2";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kTimeout);
      EXPECT_NE(std::string(e.what()).find("ranks [2]"), std::string::npos) << e.what();
    }
    EXPECT_LT(Clock::now() - start, 5s);
  });
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlop::transport
