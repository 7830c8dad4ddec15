// Endpoints between two workers of one process, and a ProgressThread that
// completes a receive while the posting thread does not progress.
#include <gtest/gtest.h>

#include <numeric>
#include <thread>

#include "core/error.hpp"
#include "transport/endpoints.hpp"
#include "transport/progress_thread.hpp"

namespace dlop::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<std::uint8_t> pattern(std::size_t bytes, std::uint8_t seed) {
  std::vector<std::uint8_t> v(bytes);
  std::iota(v.begin(), v.end(), seed);
  return v;
}

Errc code_of(Request& r) {
  try {
    r.wait(10s);
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::kInvalidArgument;  // "no error": never what these tests expect
}

TEST(Endpoints, TaggedSendLandsInTheMatchingReceiveAcrossSizes) {
  UcxWorker a_worker, b_worker;
  Endpoints a(a_worker, {}), b(b_worker, {});
  const int to_b = a.connect(b_worker.address(), true, "b");
  for (const std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, std::size_t{3} << 20}) {
    const auto data = pattern(bytes, static_cast<std::uint8_t>(bytes));
    std::vector<std::uint8_t> got(bytes + 1, 0xEE);
    // Two receives; only the one whose tag matches under the mask gets it.
    std::vector<std::uint8_t> other(bytes + 1, 0xEE);
    Request wrong = b.recv(-1, other.data(), bytes, 0x77, ~std::uint64_t{0});
    Request recv = b.recv(-1, got.data(), bytes, 0x1234, 0xFFFF);
    Request send = a.send(to_b, data.data(), bytes, 0xABCD1234);
    const auto deadline = Clock::now() + 30s;
    while (!(recv.done() && send.done()) && Clock::now() < deadline) {
      a.progress();
      b.progress();
    }
    recv.wait(1s);
    send.wait(1s);
    EXPECT_EQ(recv.received_bytes(), bytes);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), got.begin())) << bytes << " bytes";
    EXPECT_EQ(got[bytes], 0xEE) << "wrote past the end";
    EXPECT_FALSE(wrong.done());
    wrong.cancel();
    EXPECT_EQ(code_of(wrong), Errc::kCanceled);
  }
}

TEST(Endpoints, ClosedPeerFailsPendingAndLaterRequestsNamingIt) {
  UcxWorker a_worker, b_worker;
  Endpoints a(a_worker, {}), b(b_worker, {});
  const int to_b = a.connect(b_worker.address(), false, "peer b");
  std::uint8_t byte = 0;
  Request pending = a.recv(to_b, &byte, 1, 5, ~std::uint64_t{0});
  a.close(to_b, "test closed it");
  EXPECT_EQ(code_of(pending), Errc::kPeerDead);
  Request later = a.send(to_b, &byte, 1, 5);
  EXPECT_TRUE(later.done());
  try {
    later.wait(1s);
    FAIL() << "a send on a closed endpoint succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kPeerDead);
    EXPECT_NE(std::string(e.what()).find("peer b"), std::string::npos) << e.what();
  }
  EXPECT_THROW(a.send(7, &byte, 1, 5), Error);  // no such peer
}

TEST(ProgressThread, ReceiveCompletesWithoutThePostingThreadProgressing) {
  UcxWorker a_worker;
  auto b_worker = std::make_shared<UcxWorker>();
  ProgressThread thread(b_worker, "test-progress");
  Endpoints a(a_worker, {});
  std::optional<Endpoints> b;
  {
    auto lock = thread.lock();
    b.emplace(*b_worker, Endpoints::Options{});
  }
  const int to_b = a.connect(b_worker->address(), true, "b");
  for (const std::size_t bytes : {std::size_t{8}, std::size_t{2} << 20}) {  // eager and rendezvous
    const auto data = pattern(bytes, 3);
    std::vector<std::uint8_t> got(bytes, 0);
    std::optional<Request> recv;
    {
      auto lock = thread.lock();
      recv.emplace(b->recv(-1, got.data(), bytes, 42, ~std::uint64_t{0}));
    }
    Request send = a.send(to_b, data.data(), bytes, 42);
    // This thread progresses only the sender's worker; the receiver's moves
    // only on the progress thread.
    const auto deadline = Clock::now() + 30s;
    bool landed = false;
    while (!landed && Clock::now() < deadline) {
      a.progress();
      auto lock = thread.lock();
      landed = recv->done();
    }
    ASSERT_TRUE(landed) << bytes << " bytes did not land in 30 s";
    send.wait(10s);
    EXPECT_GT(thread.active_passes(), 0u);
    auto lock = thread.lock();
    recv->wait(1s);
    EXPECT_EQ(got, data);
    recv.reset();
  }
  while (a.progress()) {
  }
  auto lock = thread.lock();
  b.reset();
}

}  // namespace
}  // namespace dlop::transport
