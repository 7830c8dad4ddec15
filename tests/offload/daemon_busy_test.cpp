// How busy a dlop-offloader says it is. BusyWindow, on a clock the test
// sets: the mean over a trailing window is exact at any reading, and what it
// keeps stays bounded. A real daemon: every BATCH_READY carries its busy
// fraction, above 0 while it makes batches back to back, falling once it
// idles; the client keeps the latest, with when it came.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <thread>

#include "busy.hpp"
#include "daemon_harness.hpp"
#include "media/codec.hpp"
#include "offload/offload_client.hpp"

namespace dlop::offload {
namespace {

using namespace std::chrono_literals;
using daemon::BusyWindow;
using Clock = BusyWindow::Clock;
using test::DaemonProcess;

const Clock::time_point kStart{100s};

TEST(OffloadBusyWindow, TheMeanOverAWindowIsExactAtAnyReading) {
  BusyWindow w(5s, kStart);
  EXPECT_EQ(w.mean(kStart, 5s), 0.0);  // no time has passed
  w.set(kStart + 1s, 2);               // two threads from 1 s
  w.set(kStart + 3s, 0);               // none from 3 s
  EXPECT_DOUBLE_EQ(w.total(kStart + 2s), 2.0);
  EXPECT_DOUBLE_EQ(w.total(kStart + 4s), 4.0);
  EXPECT_DOUBLE_EQ(w.mean(kStart + 4s, 5s), 1.0);       // younger than the window: since the start
  EXPECT_DOUBLE_EQ(w.mean(kStart + 4s, 2s), 1.0);       // [2, 4]: 2 thread seconds
  EXPECT_DOUBLE_EQ(w.mean(kStart + 4s, 1s), 0.0);       // [3, 4]: idle
  EXPECT_DOUBLE_EQ(w.mean(kStart + 3500ms, 1s), 1.0);   // [2.5, 3.5]: half a second of two threads
  EXPECT_DOUBLE_EQ(w.mean(kStart + 6s, 5s), 0.8);       // [1, 6]: 4 thread seconds
  EXPECT_DOUBLE_EQ(w.mean(kStart + 6s, 60s), 0.8);      // at most the longest window
  EXPECT_DOUBLE_EQ(w.mean(kStart + 9s, 5s), 0.0);       // [4, 9]: idle
}

TEST(OffloadBusyWindow, KeepsWhatItsLongestWindowNeedsAndNoMore) {
  BusyWindow w(5s, kStart);
  // 1000 s of 10 ms batches every 20 ms on one thread.
  for (int i = 0; i < 50000; ++i) {
    w.set(kStart + i * 20ms, 1);
    w.set(kStart + i * 20ms + 10ms, 0);
  }
  EXPECT_LE(w.notes(), static_cast<std::size_t>(5s / 10ms) + 2);
  const Clock::time_point end = kStart + 1000s;
  EXPECT_NEAR(w.total(end), 500.0, 1e-6);
  EXPECT_NEAR(w.mean(end, 5s), 0.5, 1e-9);
  EXPECT_NEAR(w.mean(end, 3s), 0.5, 1e-9);
  EXPECT_NEAR(w.mean(end - 5ms, 15ms), 2.0 / 3, 1e-9);  // the last batch, then 5 ms idle
}

TEST(OffloadBusyWindow, AChangeNotedLateCountsFromTheLastOne) {
  BusyWindow w(5s, kStart);
  w.set(kStart + 2s, 1);
  w.set(kStart + 1s, 0);  // its clock read before another thread's change: from 2 s on
  EXPECT_DOUBLE_EQ(w.total(kStart + 3s), 0.0);
  EXPECT_DOUBLE_EQ(w.mean(kStart + 3s, 5s), 0.0);
}

constexpr const char* kSpec = R"({"ops": [{"op": "random_resized_crop", "size": 32}, {"op": "hflip", "p": 0.5}]})";

// Direct writes (the default on one host) and UCX: each answers from its own place.
class OffloadDaemonBusyTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    for (int c = 0; c < 2; ++c) {
      for (int i = 0; i < 4; ++i) {
        const media::Image img = test::make_image(48 + 8 * i, 40 + 8 * c, static_cast<std::uint32_t>(c * 10 + i));
        test::write_file(data_.path() / ("class" + std::to_string(c)) / ("img" + std::to_string(i) + ".jpg"),
                         media::encode_jpeg(img, 85));
      }
    }
  }
  test::TempDir data_;
};

INSTANTIATE_TEST_SUITE_P(DirectAndUcx, OffloadDaemonBusyTest, ::testing::Bool(), test::direct_or_ucx);

TEST_P(OffloadDaemonBusyTest, BatchesCarryAFractionThatRisesWithWorkAndFallsWhenIdle) {
  DaemonProcess d(1);
  OffloadClient client("127.0.0.1", d.port(), test::kToken,
                       {.name = "busy", .timeout = 30s, .worker = nullptr, .direct = GetParam()});
  const BatchLayout& layout = client.configure({data_.path().string(), kSpec, 7, 8});
  ASSERT_EQ(layout.direct, GetParam());
  EXPECT_FALSE(client.busy().has_value()) << "a busy fraction before any batch";
  std::vector<std::uint64_t> indices(8);
  std::iota(indices.begin(), indices.end(), 0);
  // Lease L writes into buffer L % 2; the lease after L is L + 2, into the buffer L freed.
  std::vector<std::vector<std::byte>> buffers(2, std::vector<std::byte>(layout.batch_bytes));
  std::uint64_t last = 0;
  const auto produce = [&](std::uint64_t lease) {
    client.produce(lease, 0, lease, indices, buffers[lease % 2].data(), layout.batch_bytes);
    last = std::max(last, lease);
  };
  // The latest answer's lease and fraction, checked in [0, 1] and stamped after `asked`.
  const auto complete = [&](Clock::time_point asked) {
    const auto c = client.wait(30s);
    EXPECT_TRUE(c && c->status == Completion::Status::kReady) << (c ? c->error : "no completion in 30 s");
    const auto& busy = client.busy();
    EXPECT_TRUE(busy.has_value());
    if (!c || !busy) return std::pair<std::uint64_t, double>{0, -1.0};
    EXPECT_GE(busy->fraction, 0.0);
    EXPECT_LE(busy->fraction, 1.0);
    EXPECT_GE(busy->when, asked);
    return std::pair{c->lease, busy->fraction};
  };

  // Loaded: two leases open at all times for 1.5 s, so the daemon always has the next batch queued.
  produce(1);
  produce(2);
  const auto loaded_until = Clock::now() + 1500ms;
  double loaded = -1;
  while (client.in_flight() > 0) {
    const auto [lease, fraction] = complete(loaded_until - 1500ms);
    ASSERT_NE(lease, 0u);
    loaded = fraction;
    if (Clock::now() < loaded_until) produce(lease + 2);
  }
  EXPECT_GT(loaded, 0.0) << "a daemon making batches back to back says it is idle";
  // Completions the loop left queued (in_flight() counts them out already) would answer the next complete().
  while (const auto leftover = client.poll()) loaded = client.busy() ? client.busy()->fraction : loaded;

  // Idle for half its window, then one batch: the answer says less; idle past the window, less again.
  std::this_thread::sleep_for(1500ms);
  auto asked = Clock::now();
  produce(last + 1);
  const double after_pause = complete(asked).second;
  EXPECT_LT(after_pause, loaded);
  EXPECT_GT(after_pause, 0.0) << "the loaded second and a half is still in the window";
  std::this_thread::sleep_for(3500ms);
  asked = Clock::now();
  produce(last + 1);
  const double idle = complete(asked).second;
  EXPECT_LT(idle, after_pause);
  EXPECT_LT(idle, 0.2) << "one small batch in three seconds";
}

}  // namespace
}  // namespace dlop::offload
