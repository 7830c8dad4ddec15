#include "transport/tcp_store.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <random>
#include <thread>

#include "common/multiprocess.hpp"
#include "core/error.hpp"

namespace dlop::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string what_of(const std::function<void()>& f, Errc expected) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expected) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no dlop::Error thrown";
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// A port nothing listens on (bound, then released).
std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = loopback(0);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

int raw_connect(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const sockaddr_in addr = loopback(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// True when the server closes fd within the timeout (EOF or reset).
bool closed_by_server(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  std::uint8_t byte = 0;
  const ssize_t n = ::recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// A request header as the wire format documents it (tcp_store_protocol.hpp),
// encoded by hand so that the test checks the format, not the encoder.
Bytes header(std::uint32_t magic, std::uint16_t version, std::uint8_t op, std::uint32_t key_len,
             std::uint32_t value_len, std::uint64_t arg = 0) {
  Bytes out;
  const auto put = [&out](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  put(magic, 4);
  put(version, 2);
  put(op, 1);
  put(0, 1);
  put(key_len, 4);
  put(value_len, 4);
  put(arg, 8);
  return out;
}
constexpr std::uint32_t kMagic = 0x54534c44;
constexpr std::uint8_t kSetOp = 1;
constexpr std::uint8_t kGetOp = 2;

Bytes pattern(std::size_t size) {
  Bytes b(size);
  for (std::size_t i = 0; i < size; ++i) b[i] = static_cast<std::uint8_t>(i * 131 + 7);
  return b;
}

TEST(TcpStore, SetGetAddEraseRoundTrips) {
  TcpStoreServer server;
  TcpStoreClient store("127.0.0.1", server.port(), 5s);
  store.set("a/b", {1, 2, 3});
  EXPECT_EQ(store.get("a/b", 0ms), (Bytes{1, 2, 3}));
  store.set("a/b", {4});
  EXPECT_EQ(store.get("a/b", 1s), (Bytes{4}));
  store.set("empty", {});
  EXPECT_TRUE(store.get("empty", 0ms).empty());
  const Bytes big = pattern(1 << 20);
  store.set("big", big);
  EXPECT_EQ(store.get("big", 0ms), big);
  EXPECT_EQ(store.add("counter", 5), 5);
  EXPECT_EQ(store.add("counter", -7), -2);
  EXPECT_EQ(store.get("counter", 0ms), (Bytes{'-', '2'}));  // decimal text, as FileStore keeps it
  EXPECT_TRUE(store.erase("a/b"));
  EXPECT_FALSE(store.erase("a/b"));
  what_of([&] { store.get("a/b", 0ms); }, Errc::kTimeout);
  // Refusals leave the connection usable.
  EXPECT_TRUE(contains(what_of([&] { store.add("big", 1); }, Errc::kProtocol), "big"));
  what_of([&] { store.set(std::string(kTcpStoreMaxKey + 1, 'k'), {}); }, Errc::kInvalidArgument);
  what_of([&] { store.set("huge", Bytes(kTcpStoreMaxValue + 1)); }, Errc::kInvalidArgument);
  store.set(std::string(kTcpStoreMaxKey, 'k'), {9});
  EXPECT_EQ(store.get(std::string(kTcpStoreMaxKey, 'k'), 0ms), (Bytes{9}));
  EXPECT_EQ(store.get("big", 0ms), big);
}

TEST(TcpStore, GetOfMissingKeyTimesOutNamingTheKey) {
  TcpStoreServer server;
  TcpStoreClient store("127.0.0.1", server.port(), 5s);
  const auto start = Clock::now();
  const std::string what = what_of([&] { store.get("never/set", 300ms); }, Errc::kTimeout);
  const auto took = Clock::now() - start;
  EXPECT_TRUE(contains(what, "never/set")) << what;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 1s);
  store.set("after", {1});  // the connection is still in step
  EXPECT_EQ(store.get("after", 0ms), (Bytes{1}));
}

TEST(TcpStore, WaitingGetIsAnsweredAsSoonAsTheKeyIsSet) {
  TcpStoreServer server;
  TcpStoreClient waiter("127.0.0.1", server.port(), 5s);
  TcpStoreClient setter("127.0.0.1", server.port(), 5s);
  auto got = std::async(std::launch::async, [&] {
    const Bytes value = waiter.get("late", 10s);
    return std::make_pair(value, Clock::now());
  });
  std::this_thread::sleep_for(200ms);
  ASSERT_EQ(got.wait_for(0ms), std::future_status::timeout) << "get returned before the key was set";
  const auto set_at = Clock::now();
  setter.set("late", {4, 2});
  const auto [value, answered_at] = got.get();
  EXPECT_EQ(value, (Bytes{4, 2}));
  EXPECT_LT(answered_at - set_at, 500ms);  // far under the 10 s timeout: no polling
}

TEST(TcpStore, ConcurrentAddsGiveTheExactTotal) {
  TcpStoreServer server;
  constexpr int kThreads = 12;
  constexpr int kAdds = 200;
  TcpStoreClient shared("127.0.0.1", server.port(), 5s);  // one client used by several threads
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::optional<TcpStoreClient> own;
      if (t % 2 == 0) own.emplace("127.0.0.1", server.port(), 5s);
      Store& store = own ? static_cast<Store&>(*own) : shared;
      for (int i = 0; i < kAdds; ++i) store.add("total", t + 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(shared.add("total", 0), static_cast<std::int64_t>(kAdds) * kThreads * (kThreads + 1) / 2);
}

// Forks a child that connects, sends `bytes`, reports through a pipe and
// waits to be killed. The child only makes async-signal-safe calls, so
// forking beside the server thread is fine.
void kill_client_after_sending(std::uint16_t port, const Bytes& bytes) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const sockaddr_in addr = loopback(port);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) ::_exit(1);
    if (::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) ::_exit(2);
    const char one = 1;
    if (::write(ready[1], &one, 1) != 1) ::_exit(3);
    while (true) ::pause();
  }
  ::close(ready[1]);
  char one = 0;
  ASSERT_EQ(::read(ready[0], &one, 1), 1) << "child could not talk to the server";
  ::close(ready[0]);
  std::this_thread::sleep_for(50ms);  // let the server read what was sent
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
}

TEST(TcpStore, ServerSurvivesClientsKilledMidMessageOrWhileWaiting) {
  TcpStoreServer server;
  TcpStoreClient store("127.0.0.1", server.port(), 5s);
  store.set("before", {1, 2});
  // A SET announcing a 1000-byte value, cut after 10 bytes of it.
  Bytes partial = header(kMagic, 1, kSetOp, 3, 1000);
  partial.insert(partial.end(), {'k', 'e', 'y', 0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  kill_client_after_sending(server.port(), partial);
  // Half a header.
  Bytes half = header(kMagic, 1, kSetOp, 1, 1);
  half.resize(12);
  kill_client_after_sending(server.port(), half);
  // A GET parked on the server, waiting for a key that is set only later.
  Bytes waiting = header(kMagic, 1, kGetOp, 4, 0, 10'000);
  waiting.insert(waiting.end(), {'l', 'a', 't', 'e'});
  kill_client_after_sending(server.port(), waiting);

  TcpStoreClient after("127.0.0.1", server.port(), 5s);
  EXPECT_EQ(after.get("before", 0ms), (Bytes{1, 2}));
  what_of([&] { after.get("key", 0ms); }, Errc::kTimeout);  // the partial SET did not land
  after.set("late", {3});
  EXPECT_EQ(store.get("late", 0ms), (Bytes{3}));
  EXPECT_EQ(store.add("n", 1), 1);
}

struct Malformed {
  const char* name;
  Bytes bytes;
};

TEST(TcpStore, MalformedMessagesCloseOnlyThatConnection) {
  TcpStoreServer server;
  TcpStoreClient good("127.0.0.1", server.port(), 5s);
  good.set("kept", {7});
  std::mt19937 rng(12345);
  Bytes random(4096);
  for (auto& b : random) b = static_cast<std::uint8_t>(rng());
  random[0] = 0;  // never the magic
  const std::vector<Malformed> cases = {
      {"bad magic", header(0xdeadbeef, 1, kSetOp, 1, 1)},
      {"bad version", header(kMagic, 99, kSetOp, 1, 1)},
      {"unknown op", header(kMagic, 1, 77, 1, 1)},
      {"key over 4 KiB", header(kMagic, 1, kSetOp, 4097, 0)},
      {"value over 64 MiB", header(kMagic, 1, kSetOp, 1, 0xffffffff)},
      {"get carrying a value", header(kMagic, 1, kGetOp, 1, 1)},
      {"random bytes", random},
  };
  for (const Malformed& m : cases) {
    const int fd = raw_connect(server.port());
    ASSERT_EQ(::send(fd, m.bytes.data(), m.bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(m.bytes.size()));
    EXPECT_TRUE(closed_by_server(fd, 2s)) << m.name << ": connection not closed";
    ::close(fd);
    EXPECT_EQ(good.get("kept", 0ms), (Bytes{7})) << "after " << m.name;
  }
  TcpStoreClient fresh("127.0.0.1", server.port(), 5s);
  EXPECT_EQ(fresh.get("kept", 0ms), (Bytes{7}));
}

TEST(TcpStore, ClientRetriesUntilALateServerStarts) {
  const std::uint16_t port = free_port();
  const auto start = Clock::now();
  auto client = std::async(std::launch::async, [port] { return std::make_unique<TcpStoreClient>("127.0.0.1", port, 10s); });
  std::this_thread::sleep_for(300ms);
  TcpStoreServer server("127.0.0.1", port);
  auto store = client.get();
  EXPECT_GE(Clock::now() - start, 300ms);
  EXPECT_LT(Clock::now() - start, 3s);
  store->set("k", {1});
  EXPECT_EQ(store->get("k", 0ms), (Bytes{1}));
}

TEST(TcpStore, ConnectToNothingTimesOutNamingTheAddress) {
  const std::uint16_t port = free_port();
  const auto start = Clock::now();
  const std::string what = what_of([&] { TcpStoreClient("127.0.0.1", port, 300ms); }, Errc::kTimeout);
  EXPECT_TRUE(contains(what, fmt::format("127.0.0.1:{}", port))) << what;
  EXPECT_GE(Clock::now() - start, 300ms);
  EXPECT_LT(Clock::now() - start, 1500ms);
}

TEST(TcpStore, ServerGoneGivesTransportErrorNamingTheAddress) {
  auto server = std::make_unique<TcpStoreServer>();
  const std::string where = fmt::format("127.0.0.1:{}", server->port());
  TcpStoreClient store("127.0.0.1", server->port(), 5s);
  TcpStoreClient waiter("127.0.0.1", server->port(), 5s);
  auto waiting = std::async(std::launch::async, [&] { return what_of([&] { waiter.get("never", 10s); }, Errc::kTransport); });
  std::this_thread::sleep_for(100ms);
  const auto start = Clock::now();
  server.reset();
  EXPECT_TRUE(contains(waiting.get(), where));
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_TRUE(contains(what_of([&] { store.set("k", {1}); }, Errc::kTransport), where));
  EXPECT_TRUE(contains(what_of([&] { store.get("k", 0ms); }, Errc::kTransport), where));
}

TEST(TcpStore, ParseHostPort) {
  EXPECT_EQ(parse_host_port("node7:29500"), std::make_pair(std::string("node7"), std::uint16_t{29500}));
  EXPECT_EQ(parse_host_port("10.0.0.1:0"), std::make_pair(std::string("10.0.0.1"), std::uint16_t{0}));
  EXPECT_EQ(parse_host_port("[::1]:80"), std::make_pair(std::string("::1"), std::uint16_t{80}));
  for (const char* bad : {"node7", ":80", "node7:", "node7:65536", "node7:8x", "node7:-1", "::1:80", "[]:80"}) {
    EXPECT_TRUE(contains(what_of([&] { parse_host_port(bad); }, Errc::kInvalidArgument), fmt::format("'{}'", bad)))
        << bad;
  }
}

// Ranks as processes: rank 0 serves the store and publishes its port through
// the file bootstrap the harness gives every rank.
class TcpBootstrapRanks : public ::testing::TestWithParam<int> {};

TEST_P(TcpBootstrapRanks, AllgatherAndBarrierOverTcpStore) {
  test::run_ranks(GetParam(), [](Bootstrap& files) {
    std::unique_ptr<TcpStoreServer> server;
    if (files.rank() == 0) {
      server = std::make_unique<TcpStoreServer>();
      const std::string port = std::to_string(server->port());
      files.set("tcp-port", Bytes(port.begin(), port.end()));
    }
    const Bytes port_text = files.get("tcp-port", 10s);
    const auto port = static_cast<std::uint16_t>(std::stoi(std::string(port_text.begin(), port_text.end())));
    {
      Bootstrap b(std::make_shared<TcpStoreClient>("127.0.0.1", port, 10s), files.rank(), files.size(), "tcp");
      for (int round = 0; round < 3; ++round) {
        const Bytes mine(static_cast<std::size_t>(b.rank() * 100 + round), static_cast<std::uint8_t>(b.rank()));
        const auto all = b.allgather(mine, 10s);
        ASSERT_EQ(all.size(), static_cast<std::size_t>(b.size()));
        for (int r = 0; r < b.size(); ++r) {
          EXPECT_EQ(all[r], Bytes(static_cast<std::size_t>(r * 100 + round), static_cast<std::uint8_t>(r)));
        }
        // Whatever a rank set before the barrier is visible to all after it.
        std::this_thread::sleep_for(std::chrono::milliseconds(10 * b.rank()));
        b.set(fmt::format("arrived/{}/{}", round, b.rank()), {1});
        b.barrier(10s);
        for (int r = 0; r < b.size(); ++r) EXPECT_NO_THROW(b.get(fmt::format("arrived/{}/{}", round, r), 0ms));
      }
    }
    files.barrier(10s);  // nobody uses the TCP store any more: rank 0 may stop serving
  }, 30s);
}

INSTANTIATE_TEST_SUITE_P(Ranks, TcpBootstrapRanks, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace dlop::transport
