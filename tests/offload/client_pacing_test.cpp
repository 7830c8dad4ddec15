// Pacing (OffloadClient::Options::pacer): each piece of a batch's UCX
// receive is posted only once the daemon sent it and the pacer granted its
// bytes, so the piece does not move before;
// the progress thread posts it when granted, with no call of the consumer's.
// Same host over UCX (direct writes off), as a daemon on another host sends.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "daemon_harness.hpp"
#include "media/codec.hpp"
#include "media/image_pipeline.hpp"
#include "media/source.hpp"
#include "offload/lease_manager.hpp"
#include "offload/offload_client.hpp"
#include "transport/progress_thread.hpp"

namespace dlop::offload {
namespace {

using namespace std::chrono_literals;

// Grants nothing while closed (but the first `budget` bytes), everything
// once opened, or `slice` bytes per call; remembers what it was asked and told.
class GatePacer final : public DataPacer {
 public:
  std::size_t acquire(std::size_t bytes, std::uint64_t deadline_step) override {
    std::lock_guard lock(mutex_);
    deadlines.push_back(deadline_step);
    sizes.push_back(bytes);
    if (!open.load()) {
      const std::size_t granted = std::min(bytes, budget);
      budget -= granted;
      return granted;
    }
    return slice == 0 ? bytes : std::min(bytes, slice);
  }
  void set_step(std::uint64_t step) override {
    std::lock_guard lock(mutex_);
    steps.push_back(step);
  }
  std::vector<std::uint64_t> asked() {
    std::lock_guard lock(mutex_);
    return deadlines;
  }
  std::vector<std::uint64_t> told() {
    std::lock_guard lock(mutex_);
    return steps;
  }
  std::vector<std::size_t> asked_bytes() {
    std::lock_guard lock(mutex_);
    return sizes;
  }
  void moved(std::size_t bytes, std::chrono::microseconds took) override {
    std::lock_guard lock(mutex_);
    moves.emplace_back(bytes, took);
  }
  std::vector<std::pair<std::size_t, std::chrono::microseconds>> told_moved() {
    std::lock_guard lock(mutex_);
    return moves;
  }
  std::atomic<bool> open{false};
  std::size_t slice = 0;
  std::size_t budget = 0;

 private:
  std::mutex mutex_;
  std::vector<std::uint64_t> deadlines, steps;
  std::vector<std::size_t> sizes;
  std::vector<std::pair<std::size_t, std::chrono::microseconds>> moves;
};

// Big enough for UCX's rendezvous (a put after the receive matched).
constexpr const char* kSpec = R"({"ops": [{"op": "random_resized_crop", "size": 64},
    {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}]})";

void write_images(const test::TempDir& data, int n) {
  for (int i = 0; i < n; ++i) {
    test::write_file(data.path() / ("c" + std::to_string(i % 2)) / ("i" + std::to_string(i) + ".jpg"),
                     media::encode_jpeg(test::make_image(70 + i, 90, static_cast<std::uint32_t>(i)), 90));
  }
}

// Cancels `lease`, held back by the pacer: it must still complete (canceled,
// or ready if its answer was on the way), never fail.
void expect_canceled_lease_completes(OffloadClient& client, std::uint64_t lease) {
  client.cancel(lease);
  const auto c = client.wait(30s);
  ASSERT_TRUE(c.has_value()) << "canceled lease " << lease << " never completed";
  EXPECT_EQ(c->lease, lease);
  EXPECT_NE(c->status, Completion::Status::kFailed) << c->error;
}

// A daemon over 5 images and clients of it paced by one closed gate.
class PacedClient : public ::testing::Test {
 protected:
  PacedClient() { write_images(data, 5); }
  // Batches here are 5 x 3 x 64 x 64 floats and labels (245,800 bytes):
  // whole by default, four pieces at the least piece size.
  std::unique_ptr<OffloadClient> connect(std::size_t piece_bytes = config().data_piece_bytes) {
    auto client = std::make_unique<OffloadClient>(
        "127.0.0.1", d.port(), test::kToken,
        OffloadClient::Options{.name = "paced", .timeout = 30s, .progress = progress, .direct = false, .pacer = pacer,
                               .piece_bytes = piece_bytes});
    client->configure({data.path().string(), kSpec, 7, 5});
    return client;
  }
  test::TempDir data;
  test::DaemonProcess d{1};
  std::shared_ptr<GatePacer> pacer = std::make_shared<GatePacer>();
  std::shared_ptr<transport::ProgressThread> progress =
      std::make_shared<transport::ProgressThread>(OffloadClient::make_worker());
};

TEST_F(PacedClient, ABatchMovesOnlyOnceGrantedThenLandsWithoutTheConsumer) {
  const auto owned = connect();
  OffloadClient& client = *owned;
  const BatchLayout& layout = client.layout();
  std::vector<std::byte> buf(layout.batch_bytes);
  const std::vector<std::uint64_t> idx = {4, 2, 0, 3, 1};
  client.produce(9, 2, 6, idx, buf.data(), buf.size());
  // The daemon makes the batch in well under this; held back, it must not land.
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(client.landed(9)) << "the batch moved before the pacer granted it";
  const auto asked = pacer->asked();
  ASSERT_FALSE(asked.empty()) << "the progress thread never asked the pacer";
  EXPECT_EQ(asked.front(), 6u) << "a batch's deadline is its position in the epoch";
  pacer->open = true;
  bool landed = false;
  for (int i = 0; i < 600 && !landed; ++i) {  // the consumer only looks
    std::this_thread::sleep_for(50ms);
    landed = client.landed(9);
  }
  ASSERT_TRUE(landed) << "granted, the batch did not land within 30 s";
  const auto c = client.wait(30s);
  ASSERT_TRUE(c && c->status == Completion::Status::kReady);
  std::vector<std::byte> images(idx.size() * layout.sample_bytes);
  std::vector<std::int64_t> labels(idx.size());
  media::ImagePipeline::from_json(kSpec).run_batch(*media::open_source(data.path().string()), idx, 7, 2, images, labels);
  EXPECT_EQ(std::memcmp(buf.data(), images.data(), images.size()), 0);
  EXPECT_EQ(std::memcmp(buf.data() + layout.labels_offset, labels.data(), labels.size() * 8), 0);
}

// Leases are issued steps ahead: asked at issue, the pacer would grant a
// batch while no gradient moves and the data would then move whenever the
// daemon sends, gradients or not. It is asked once the batch has arrived.
TEST_F(PacedClient, ThePacerIsAskedWhenTheBatchArrivesNotWhenItIsLeased) {
  const auto owned = connect();
  OffloadClient& client = *owned;
  std::vector<std::byte> buf(client.layout().batch_bytes);
  const std::vector<std::uint64_t> idx = {1, 3};
  pacer->open = true;
  d.kill(SIGSTOP);  // leased, but not made
  client.produce(4, 0, 2, idx, buf.data(), buf.size());
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(pacer->asked().empty()) << "the pacer was asked before the daemon made the batch";
  d.kill(SIGCONT);
  const auto c = client.wait(30s);
  ASSERT_TRUE(c && c->status == Completion::Status::kReady);
  EXPECT_EQ(pacer->asked(), std::vector<std::uint64_t>{2});
}

TEST_F(PacedClient, ALeaseHeldBackCanBeCanceledAndTheClientClosed) {
  {
    const auto owned = connect();
    OffloadClient& client = *owned;
    const BatchLayout& layout = client.layout();
    std::vector<std::byte> a(layout.batch_bytes), b(layout.batch_bytes);
    const std::vector<std::uint64_t> idx = {0, 1, 2};
    client.produce(1, 0, 3, idx, a.data(), a.size());
    client.produce(2, 0, 4, idx, b.data(), b.size());
    std::this_thread::sleep_for(500ms);
    expect_canceled_lease_completes(client, 1);
    // Lease 2 is still held back: the destructor must not wait on it.
  }
  // The daemon serves the next client: nothing of the old one is stuck in it.
  OffloadClient again("127.0.0.1", d.port(), test::kToken, {.name = "after", .timeout = 30s, .direct = false});
  const BatchLayout& layout = again.configure({data.path().string(), kSpec, 7, 5});
  std::vector<std::byte> buf(layout.batch_bytes);
  const std::vector<std::uint64_t> idx = {0};
  again.produce(1, 0, 0, idx, buf.data(), buf.size());
  const auto c = again.wait(30s);
  ASSERT_TRUE(c && c->status == Completion::Status::kReady);
}

// A batch goes in pieces, each asked for when it arrives: a gradient that
// starts while a batch moves waits behind one piece, not the whole batch.
TEST_F(PacedClient, ABatchInPiecesMovesOnlyThePiecesGranted) {
  constexpr std::size_t kPiece = protocol::kMinPieceBytes;
  const auto owned = connect(kPiece);
  OffloadClient& client = *owned;
  const BatchLayout& layout = client.layout();
  ASSERT_EQ(layout.batch_bytes, 245'800u);
  std::vector<std::byte> buf(layout.batch_bytes, std::byte{0xab});
  const std::vector<std::uint64_t> idx = {4, 2, 0, 3, 1};
  pacer->budget = kPiece + 100;  // the first piece, and not all of the second
  client.produce(9, 2, 6, idx, buf.data(), buf.size());
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(client.landed(9));
  std::vector<std::byte> images(idx.size() * layout.sample_bytes);
  std::vector<std::int64_t> labels(idx.size());
  media::ImagePipeline::from_json(kSpec).run_batch(*media::open_source(data.path().string()), idx, 7, 2, images, labels);
  EXPECT_EQ(std::memcmp(buf.data(), images.data(), kPiece), 0) << "the granted piece did not land";
  EXPECT_TRUE(std::all_of(buf.begin() + kPiece, buf.end(), [](std::byte b) { return b == std::byte{0xab}; }))
      << "bytes past the granted piece moved";
  const auto held = pacer->asked_bytes();
  ASSERT_GE(held.size(), 3u);
  EXPECT_EQ(held[0], kPiece);        // piece 0, granted
  EXPECT_EQ(held[1], kPiece);        // piece 1: 100 bytes granted ...
  EXPECT_EQ(held[2], kPiece - 100);  // ... the rest asked for again
  pacer->open = true;
  const auto c = client.wait(30s);
  ASSERT_TRUE(c && c->status == Completion::Status::kReady);
  EXPECT_EQ(c->bytes, layout.batch_bytes);
  EXPECT_EQ(std::memcmp(buf.data(), images.data(), images.size()), 0);
  EXPECT_EQ(std::memcmp(buf.data() + layout.labels_offset, labels.data(), labels.size() * 8), 0);
  const auto asked = pacer->asked_bytes();
  EXPECT_EQ(asked.back(), layout.batch_bytes - 3 * kPiece) << "the last, short piece is asked for its own size";
  // Each landed piece tells the pacer its size and how long it moved (the
  // last one on the progress thread's pass after it landed).
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (pacer->told_moved().size() < 4 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  const auto moves = pacer->told_moved();
  ASSERT_EQ(moves.size(), 4u);
  for (std::size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(moves[k].first, k < 3 ? kPiece : layout.batch_bytes - 3 * kPiece) << "piece " << k;
    EXPECT_GT(moves[k].second.count(), 0) << "piece " << k;
  }
}

TEST_F(PacedClient, ABatchHalfMovedInPiecesCanBeCanceled) {
  const auto owned = connect(protocol::kMinPieceBytes);
  OffloadClient& client = *owned;
  std::vector<std::byte> buf(client.layout().batch_bytes);
  const std::vector<std::uint64_t> idx = {0, 1, 2, 3, 4};
  pacer->budget = 2 * protocol::kMinPieceBytes;
  client.produce(3, 0, 5, idx, buf.data(), buf.size());
  std::this_thread::sleep_for(1000ms);
  expect_canceled_lease_completes(client, 3);
  // The connection still serves: the daemon's sends of the lease all ended.
  pacer->open = true;
  client.produce(4, 0, 6, idx, buf.data(), buf.size());
  const auto next = client.wait(30s);
  ASSERT_TRUE(next && next->status == Completion::Status::kReady);
}

TEST(OffloadPacing, LeaseManagerYieldsTheEpochOnceInOrderUnderSlicedCreditAndTellsTheSteps) {
  test::TempDir data;
  write_images(data, 11);
  test::DaemonProcess d(2);
  auto pacer = std::make_shared<GatePacer>();
  pacer->open = true;
  pacer->slice = 4096;  // a batch needs many grants, banked across passes
  LeaseOptions o;
  o.config = {data.path().string(), kSpec, 3, 2};
  o.token = test::kToken;
  o.pacer = pacer;
  o.direct = false;
  LeaseManager m(std::move(o));
  m.add_daemon("127.0.0.1", d.port());
  m.set_epoch(1);
  const auto expected = m.plan().batches(1);
  std::vector<std::uint64_t> positions;
  while (auto b = m.next()) {
    EXPECT_EQ(b->indices, expected[b->position]);
    positions.push_back(b->position);
    m.release(b->slot);
  }
  std::vector<std::uint64_t> in_order(expected.size());
  for (std::uint64_t i = 0; i < in_order.size(); ++i) in_order[i] = i;
  EXPECT_EQ(positions, in_order);
  std::vector<std::uint64_t> told = pacer->told();
  ASSERT_FALSE(told.empty());
  EXPECT_EQ(told.front(), 0u);  // set_epoch starts at step 0
  told.erase(told.begin());
  EXPECT_EQ(told, in_order) << "the pacer is told each step as its batch is taken";
  EXPECT_GT(pacer->asked().size(), expected.size()) << "no batch needed more than one grant";
}

}  // namespace
}  // namespace dlop::offload
