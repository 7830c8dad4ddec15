// A real dlop-offloader against hostile or broken clients: no token, a wrong
// token, replayed, oversized, corrupt, random and half-written frames, silent
// connections. Each must be closed by the daemon, which keeps serving others.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "common/expect_error.hpp"
#include "core/error.hpp"
#include "daemon_harness.hpp"
#include "offload/offload_client.hpp"

namespace dlop::offload {
namespace {

using namespace std::chrono_literals;
using protocol::MsgType;
using test::DaemonProcess;
using test::RawConn;

// A well-behaved client still gets through.
void expect_serving(DaemonProcess& d) {
  ASSERT_TRUE(d.running());
  OffloadClient good("127.0.0.1", d.port(), test::kToken, {.name = "good", .timeout = 10s});
  EXPECT_NO_THROW(good.ping());
}

// The connection closed by the daemon (within `timeout`), which still serves others.
void expect_dropped(RawConn& c, DaemonProcess& d, std::chrono::milliseconds timeout = 10s) {
  EXPECT_TRUE(c.closed_by_peer(timeout));
  expect_serving(d);
}

// The daemon's counter `name`, as a client reads it.
std::uint64_t counter(DaemonProcess& d, const std::string& name) {
  OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 10s});
  for (const auto& [n, v] : client.stats().counters) {
    if (n == name) return v;
  }
  ADD_FAILURE() << "no counter " << name;
  return 0;
}

TEST(OffloadDaemon, AuthenticatesAndAnswersPing) {
  DaemonProcess d;
  RawConn c(d.port());
  const auto welcome = c.authenticate();
  ASSERT_TRUE(welcome.has_value());
  EXPECT_EQ(welcome->pid, static_cast<std::uint32_t>(d.pid()));
  EXPECT_EQ(welcome->threads, 2u);
  c.write(c.writer.encode(MsgType::kPing, protocol::encode(protocol::Ping{5})));
  const auto pong = c.read_frame();
  ASSERT_TRUE(pong.has_value());
  ASSERT_EQ(pong->type, MsgType::kPong);
  EXPECT_EQ(protocol::decode<protocol::Pong>(pong->payload).token, 5u);
}

TEST(OffloadDaemon, WrongTokenIsRefused) {
  DaemonProcess d;
  dlop::test::expect_error(
      [&] { OffloadClient("127.0.0.1", d.port(), "not-the-right-token-at-all", {.timeout = 10s}); },
      Errc::kInvalidArgument, "refused the token", "a wrong token was accepted");
  RawConn raw(d.port());
  EXPECT_FALSE(raw.authenticate("another-wrong-token-0000").has_value());
  expect_dropped(raw, d);
  EXPECT_EQ(counter(d, "auth_failures"), 2u);
}

TEST(OffloadDaemon, NothingIsAcceptedBeforeAuthentication) {
  DaemonProcess d;
  // A well-formed CONFIGURE (sequence 0, valid checksum) without HELLO.
  RawConn c(d.port());
  ASSERT_TRUE(c.read_frame().has_value());  // CHALLENGE
  protocol::Configure m{{1, 2, 3}, "host", "/", "{}", {}, 0, 1};
  c.write(c.writer.encode(MsgType::kConfigure, protocol::encode(m)));
  EXPECT_TRUE(c.closed_by_peer());
  // A keyed frame under a key the client made up.
  RawConn k(d.port());
  protocol::Key key{};
  k.writer.set_key(key);
  k.write(k.writer.encode(MsgType::kPing, protocol::encode(protocol::Ping{1})));
  expect_dropped(k, d);
}

TEST(OffloadDaemon, ReplayedFrameClosesTheConnection) {
  DaemonProcess d;
  RawConn c(d.port());
  ASSERT_TRUE(c.authenticate().has_value());
  const protocol::Bytes ping = c.writer.encode(MsgType::kPing, protocol::encode(protocol::Ping{1}));
  c.write(ping);
  ASSERT_TRUE(c.read_frame().has_value());
  c.write(ping);  // the same bytes again: stale sequence number
  EXPECT_TRUE(c.closed_by_peer());
  // The frame recorded on one connection replayed on another: the keys differ.
  RawConn other(d.port());
  ASSERT_TRUE(other.authenticate().has_value());
  // (`ping` has sequence 1, which is what `other` expects next.)
  other.write(ping);
  expect_dropped(other, d);
}

TEST(OffloadDaemon, OversizedFramesAreRefusedBeforeTheirPayload) {
  DaemonProcess d;
  // Before authentication the limit is 1 KiB.
  RawConn pre(d.port());
  ASSERT_TRUE(pre.read_frame().has_value());
  const protocol::Bytes big(4096, 0);
  pre.write(pre.writer.encode(MsgType::kHello, big));
  EXPECT_TRUE(pre.closed_by_peer());
  // After it, 16 MiB: a header announcing 1 GiB is refused at once, without
  // the daemon waiting for (or allocating) the payload.
  RawConn post(d.port());
  ASSERT_TRUE(post.authenticate().has_value());
  protocol::Bytes header = post.writer.encode(MsgType::kPing, protocol::encode(protocol::Ping{1}));
  header.resize(protocol::kHeaderBytes);
  header[12] = 0;
  header[13] = 0;
  header[14] = 0;
  header[15] = 0x40;
  post.write(header);
  expect_dropped(post, d, 5s);
}

TEST(OffloadDaemon, CorruptFrameClosesTheConnection) {
  DaemonProcess d;
  RawConn c(d.port());
  ASSERT_TRUE(c.authenticate().has_value());
  protocol::Bytes ping = c.writer.encode(MsgType::kPing, protocol::encode(protocol::Ping{1}));
  ping[protocol::kHeaderBytes] ^= 0x01;
  c.write(ping);
  expect_dropped(c, d);
}

TEST(OffloadDaemon, RandomBytesCloseTheConnection) {
  DaemonProcess d;
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    RawConn c(d.port());
    protocol::Bytes junk(1 + rng() % 3000);
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
    if (i % 2 == 1) std::copy_n("DLOF\x01\x00", 6, junk.begin() + 0);  // get past the magic
    c.write(junk);
    EXPECT_TRUE(c.closed_by_peer(5s)) << "round " << i;
  }
  // Random bytes after authentication, too.
  RawConn a(d.port());
  ASSERT_TRUE(a.authenticate().has_value());
  protocol::Bytes junk(500);
  for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
  a.write(junk);
  expect_dropped(a, d);
  EXPECT_GE(counter(d, "protocol_errors"), 21u);
}

TEST(OffloadDaemon, HalfWrittenFrameThenDisconnect) {
  DaemonProcess d;
  {
    RawConn c(d.port());
    ASSERT_TRUE(c.authenticate().has_value());
    const protocol::Bytes ping = c.writer.encode(MsgType::kPing, protocol::encode(protocol::Ping{1}));
    c.write(std::span(ping).first(ping.size() / 2));
    std::this_thread::sleep_for(100ms);
  }  // closed mid-frame
  expect_serving(d);
}

TEST(OffloadDaemon, SilentAndStalledConnectionsAreDropped) {
  DaemonProcess d(1, {"--auth-timeout-ms", "300", "--frame-timeout-ms", "300"});
  RawConn silent(d.port());  // never says HELLO
  RawConn stalled(d.port());
  ASSERT_TRUE(stalled.authenticate().has_value());
  const protocol::Bytes ping = stalled.writer.encode(MsgType::kPing, protocol::encode(protocol::Ping{1}));
  stalled.write(std::span(ping).first(10));  // and never the rest
  EXPECT_TRUE(silent.closed_by_peer(5s));
  expect_dropped(stalled, d, 5s);
}

TEST(OffloadDaemon, ClientOnlyMessagesFromAClientCloseIt) {
  DaemonProcess d;
  RawConn c(d.port());
  ASSERT_TRUE(c.authenticate().has_value());
  c.write(c.writer.encode(MsgType::kWelcome, protocol::encode(protocol::Welcome{1, 1, "x", "h"})));
  expect_dropped(c, d);
}

TEST(OffloadDaemon, RefusesATokenFileOthersCanRead) {
  test::TempDir dir;
  const auto path = dir.path() / "token";
  std::ofstream(path) << test::kToken;
  ::chmod(path.c_str(), 0644);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(DLOP_OFFLOADER_PATH, DLOP_OFFLOADER_PATH, "--token-file", path.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
}

TEST(OffloadDaemon, StopsOnSigterm) {
  DaemonProcess d;
  d.kill(SIGTERM);
  const auto status = d.wait_exit(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

}  // namespace
}  // namespace dlop::offload
