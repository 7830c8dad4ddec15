// LeaseManager against real dlop-offloader processes: every batch of an epoch
// arrives once, in order, bit-identical to the pipeline run here on the same
// plan, while daemons are SIGKILLed, stopped and started; a cursor taken
// mid-epoch resumes with the same following batches; ranks get equal counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "core/error.hpp"
#include "daemon_harness.hpp"
#include "media/codec.hpp"
#include "media/image_pipeline.hpp"
#include "media/source.hpp"
#include "offload/lease_manager.hpp"

namespace dlop::offload {
namespace {

using namespace std::chrono_literals;
using test::DaemonProcess;

constexpr const char* kSpec = R"({"ops": [{"op": "random_resized_crop", "size": 24}, {"op": "hflip", "p": 0.5},
  {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}]})";
constexpr std::uint64_t kSeed = 77;
constexpr std::uint32_t kBatch = 4;

// One batch as bytes: images then labels, as the pipeline makes it here.
using Bytes = std::vector<std::byte>;

class LeaseManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 9; ++i) {
        const media::Image img = test::make_image(30 + 3 * i, 36 + 4 * c, static_cast<std::uint32_t>(c * 100 + i));
        test::write_file(data_.path() / "train" / ("c" + std::to_string(c)) / ("i" + std::to_string(i) + ".jpg"),
                         media::encode_jpeg(img, 85));
      }
    }
  }
  std::string folder() const { return (data_.path() / "train").string(); }

  LeaseOptions options(std::uint32_t rank = 0, std::uint32_t world = 1) const {
    LeaseOptions o;
    o.config = {folder(), kSpec, kSeed, kBatch};
    o.token = test::kToken;
    o.rank = rank;
    o.world = world;
    o.prefetch = 4;
    o.connect_timeout = 30s;
    o.no_daemon_timeout = 30s;
    return o;
  }

  // The reference: the plan's batches run by the pipeline in this process.
  Bytes local_batch(const std::vector<std::uint64_t>& indices, std::uint64_t epoch) const {
    return test::local_batch(folder(), kSpec, kSeed, 24, indices, epoch);
  }

  Bytes received(const Batch& b, const BatchLayout& l) const {
    Bytes out(b.images, b.images + b.count * l.sample_bytes);
    const auto* lab = reinterpret_cast<const std::byte*>(b.labels);
    out.insert(out.end(), lab, lab + b.count * 8);
    return out;
  }

  // Drains the epoch from m, checking order and content; calls `between`
  // after each batch. Returns the samples seen.
  std::vector<std::uint64_t> drain(LeaseManager& m, std::uint64_t epoch, const std::function<void(std::uint64_t)>& between = {}) {
    const auto plan = m.plan().batches(epoch);
    std::vector<std::uint64_t> seen;
    std::uint64_t expected = m.state().position;
    while (auto b = m.next()) {
      EXPECT_EQ(b->position, expected++) << "batches out of order";
      EXPECT_EQ(b->indices, plan.at(b->position));
      EXPECT_EQ(b->count, b->indices.size());
      EXPECT_TRUE(received(*b, m.layout()) == local_batch(b->indices, epoch))
          << "batch " << b->position << " differs from the local pipeline";
      seen.insert(seen.end(), b->indices.begin(), b->indices.end());
      m.release(b->slot);
      if (between) between(b->position);
    }
    EXPECT_EQ(expected, plan.size());
    return seen;
  }

  std::vector<std::uint64_t> all_samples(std::uint64_t epoch) const {
    EpochPlan p{27, kBatch, kSeed, true, false, 0, 1};
    std::vector<std::uint64_t> v;
    for (const auto& b : p.batches(epoch)) v.insert(v.end(), b.begin(), b.end());
    return v;
  }

  test::TempDir data_;
};

std::vector<std::uint64_t> sorted(std::vector<std::uint64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(EpochPlanTest, OrderIsASeededPermutationAndRanksGetEqualCounts) {
  EpochPlan p{101, 8, 5, true, false, 0, 1};
  const auto a = p.order(3);
  EXPECT_EQ(a, p.order(3)) << "order must be a pure function of (seed, epoch)";
  EXPECT_NE(a, p.order(4));
  std::vector<std::uint64_t> iota(101);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted(a), iota);
  for (const bool drop : {false, true}) {
    for (const std::uint64_t n : {1u, 7u, 26u, 27u, 100u, 101u}) {
      std::vector<std::uint64_t> union_;
      std::size_t count = 0;
      for (std::uint32_t r = 0; r < 3; ++r) {
        EpochPlan q{n, 4, 9, true, drop, r, 3};
        const auto bs = q.batches(2);
        if (r == 0) count = bs.size();
        EXPECT_EQ(bs.size(), count) << "rank " << r << " n " << n << " drop_last " << drop;
        EXPECT_EQ(bs.size(), q.batch_count());
        for (const auto& b : bs) {
          if (drop) {
            EXPECT_EQ(b.size(), 4u);
          }
          union_.insert(union_.end(), b.begin(), b.end());
        }
      }
      // Padding repeats samples; dropping loses fewer than world + world*batch.
      std::set<std::uint64_t> distinct(union_.begin(), union_.end());
      if (drop) {
        EXPECT_EQ(union_.size(), distinct.size());
        EXPECT_GT(union_.size() + 3 + 3 * 4, n);
      } else {
        EXPECT_EQ(distinct.size(), n);
      }
    }
  }
}

TEST_F(LeaseManagerTest, FaultFreeEpochMatchesTheLocalPipeline) {
  DaemonProcess d1(1), d2(1);
  LeaseManager m(options());
  m.add_daemon("127.0.0.1", d1.port());
  m.add_daemon("127.0.0.1", d2.port());
  EXPECT_EQ(m.batch_count(), 7u);
  for (const double busy : m.busy_per_daemon()) EXPECT_TRUE(std::isnan(busy)) << "busy before any batch: " << busy;
  m.set_epoch(1);
  EXPECT_EQ(sorted(drain(m, 1)), sorted(all_samples(1)));
  const auto per = m.completed_per_daemon();
  EXPECT_GT(per[0], 0u);
  EXPECT_GT(per[1], 0u);
  // Both made batches, and said how busy that kept them.
  const auto busy = m.busy_per_daemon();
  ASSERT_EQ(busy.size(), 2u);
  for (const double b : busy) EXPECT_TRUE(b > 0 && b <= 1) << b;
  m.set_epoch(2);
  EXPECT_EQ(sorted(drain(m, 2)), sorted(all_samples(2)));
  // A dead daemon's fraction is unknown; the live one's stays known.
  d1.kill(SIGKILL);
  m.set_epoch(3);
  EXPECT_EQ(sorted(drain(m, 3)), sorted(all_samples(3)));
  ASSERT_EQ(m.live_daemons(), 1u);
  EXPECT_TRUE(std::isnan(m.busy_per_daemon().at(0)));
  EXPECT_TRUE(m.busy_per_daemon().at(1) > 0 && m.busy_per_daemon().at(1) <= 1);
}

TEST_F(LeaseManagerTest, SigkilledDaemonsAndNewOnesStillGiveEveryBatchOnce) {
  std::mt19937 rng(12345);
  std::uint64_t reissued = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<std::unique_ptr<DaemonProcess>> daemons;
    std::set<DaemonProcess*> doomed;
    std::vector<std::thread> killers;
    LeaseManager m(options());
    for (int i = 0; i < 3; ++i) {
      daemons.push_back(std::make_unique<DaemonProcess>(1));
      m.add_daemon("127.0.0.1", daemons.back()->port());
    }
    m.set_epoch(5);
    const auto seen = drain(m, 5, [&](std::uint64_t) {
      if (rng() % 2 == 0) return;
      // Kill a random daemon, then maybe start a new one. It is stopped
      // first and killed a little later, so that it dies holding leases (the
      // answers a daemon sent before it died count: killed idle, it would
      // test nothing).
      DaemonProcess* victim = daemons[rng() % daemons.size()].get();
      if (victim->running() && doomed.insert(victim).second) {
        victim->kill(SIGSTOP);
        killers.emplace_back([victim] {
          std::this_thread::sleep_for(100ms);
          victim->kill(SIGKILL);
        });
      }
      if (rng() % 3 != 0) {
        daemons.push_back(std::make_unique<DaemonProcess>(1));
        m.add_daemon("127.0.0.1", daemons.back()->port());
      }
      const bool any = std::any_of(daemons.begin(), daemons.end(),
                                   [&](auto& p) { return p->running() && !doomed.contains(p.get()); });
      if (!any) {
        daemons.push_back(std::make_unique<DaemonProcess>(1));
        m.add_daemon("127.0.0.1", daemons.back()->port());
      }
    });
    for (auto& k : killers) k.join();
    EXPECT_EQ(sorted(seen), sorted(all_samples(5))) << "round " << round;
    EXPECT_GE(m.leases_issued(), m.batch_count());
    reissued += m.leases_reissued();
  }
  EXPECT_GT(reissued, 0u) << "no kill hit an open lease: the test did not test reissue";
}

TEST_F(LeaseManagerTest, ResumesFromACursorWithAnotherNumberOfDaemons) {
  std::vector<std::uint64_t> first;
  Cursor cursor;
  {
    DaemonProcess d1(1), d2(1), d3(1);
    LeaseManager m(options());
    for (auto* d : {&d1, &d2, &d3}) m.add_daemon("127.0.0.1", d->port());
    m.set_epoch(3);
    for (int i = 0; i < 3; ++i) {
      auto b = m.next();
      ASSERT_TRUE(b);
      EXPECT_TRUE(received(*b, m.layout()) == local_batch(b->indices, 3));
      first.insert(first.end(), b->indices.begin(), b->indices.end());
      m.release(b->slot);
    }
    cursor = m.state();
    d2.kill(SIGKILL);  // dies with leases open past the cursor
  }
  EXPECT_EQ(cursor.epoch, 3u);
  EXPECT_EQ(cursor.position, 3u);
  DaemonProcess d(2);
  LeaseManager m(options());
  m.add_daemon("127.0.0.1", d.port());
  m.restore(cursor);
  auto rest = drain(m, 3);
  first.insert(first.end(), rest.begin(), rest.end());
  EXPECT_EQ(first, all_samples(3)) << "resumed epoch is not the uninterrupted one";

  Cursor other = cursor;
  other.seed += 1;
  EXPECT_THROW(m.restore(other), Error);
}

TEST_F(LeaseManagerTest, ThreeRanksGetEqualBatchCountsAndTogetherEverySample) {
  DaemonProcess d(2);
  std::vector<std::uint64_t> all;
  std::vector<std::size_t> counts;
  for (std::uint32_t r = 0; r < 3; ++r) {
    LeaseManager m(options(r, 3));
    m.add_daemon("127.0.0.1", d.port());
    m.set_epoch(0);
    std::size_t n = 0;
    const auto plan = m.plan().batches(0);
    while (auto b = m.next()) {
      EXPECT_TRUE(received(*b, m.layout()) == local_batch(b->indices, 0));
      all.insert(all.end(), b->indices.begin(), b->indices.end());
      m.release(b->slot);
      ++n;
    }
    counts.push_back(n);
  }
  EXPECT_EQ(counts, std::vector<std::size_t>(3, 3));  // 27 samples / 3 ranks = 9 each, batches of 4: 3
  EXPECT_EQ(sorted(all), sorted(all_samples(0)));
}

TEST_F(LeaseManagerTest, DaemonJoiningMidEpochGetsWork) {
  DaemonProcess d1(1);
  LeaseManager m(options());
  m.add_daemon("127.0.0.1", d1.port());
  m.set_epoch(0);
  std::unique_ptr<DaemonProcess> d2;
  drain(m, 0, [&](std::uint64_t pos) {
    if (pos == 0) {
      d2 = std::make_unique<DaemonProcess>(1);
      m.add_daemon("127.0.0.1", d2->port());
    }
  });
  EXPECT_GT(m.completed_per_daemon().at(1), 0u) << "the new daemon got no work";
}


// A consumer slower than the daemon never waits in next(): its batches have
// always landed. The window must still move with it, or the manager leases
// nothing new until it runs dry and the daemon idles while the trainer computes.
TEST_F(LeaseManagerTest, ConsumerThatNeverWaitsKeepsTheWindowLeased) {
  DaemonProcess d(1);
  auto o = options();
  o.per_daemon = o.prefetch;  // the window, not the daemon's share, bounds the leases
  LeaseManager m(o);
  m.add_daemon("127.0.0.1", d.port());
  m.set_epoch(2);
  const std::uint64_t n = m.batch_count();
  drain(m, 2, [&](std::uint64_t pos) {
    EXPECT_EQ(m.leases_issued(), std::min<std::uint64_t>(pos + o.prefetch, n))
        << "after taking batch " << pos << " the window past it is not leased";
    std::this_thread::sleep_for(300ms);  // "compute": the daemon makes the window meanwhile
  });
  EXPECT_EQ(m.leases_reissued(), 0u);
}
TEST_F(LeaseManagerTest, StoppedDaemonsLeaseTimesOutAndIsReissued) {
  DaemonProcess d1(1), d2(1);
  auto o = options();
  o.lease_timeout = 1500ms;
  LeaseManager m(o);
  m.add_daemon("127.0.0.1", d1.port());
  m.set_epoch(4);
  d1.kill(SIGSTOP);  // alive, socket open, answers nothing
  m.add_daemon("127.0.0.1", d2.port());
  EXPECT_EQ(sorted(drain(m, 4)), sorted(all_samples(4)));
  EXPECT_GT(m.leases_reissued(), 0u);
  d1.kill(SIGKILL);
}

// A stopped daemon that resumes answers leases already reissued: its late
// batches (or cancellations) must be dropped, never yielded twice.
TEST_F(LeaseManagerTest, LateAnswersOfReissuedLeasesAreDropped) {
  DaemonProcess d1(1), d2(1);
  auto o = options();
  o.lease_timeout = 800ms;
  LeaseManager m(o);
  m.add_daemon("127.0.0.1", d1.port());
  m.add_daemon("127.0.0.1", d2.port());
  m.set_epoch(6);
  d1.kill(SIGSTOP);
  const auto seen = drain(m, 6, [&](std::uint64_t pos) {
    if (pos == 2) d1.kill(SIGCONT);
  });
  EXPECT_EQ(sorted(seen), sorted(all_samples(6)));
  EXPECT_GT(m.leases_reissued(), 0u);
  // Another epoch on the same daemons: nothing of the last one leaks into it.
  m.set_epoch(7);
  EXPECT_EQ(sorted(drain(m, 7)), sorted(all_samples(7)));
}

// Reissuing alone would wait forever on the only daemon when it takes leases
// and never answers: it is dropped after two lease timeouts of silence, and
// the wait ends as with no daemon left. Its buffers stay its own.
TEST_F(LeaseManagerTest, ASilentDaemonIsDroppedAndTheWaitEnds) {
  DaemonProcess d1(1), d2(1);
  auto o = options();
  o.lease_timeout = 300ms;
  o.no_daemon_timeout = 300ms;
  LeaseManager m(o);
  m.add_daemon("127.0.0.1", d1.port());
  m.add_daemon("127.0.0.1", d2.port());
  m.set_epoch(3);
  d1.kill(SIGSTOP);  // alive, socket open, answers nothing
  EXPECT_EQ(sorted(drain(m, 3)), sorted(all_samples(3)));

  d2.kill(SIGSTOP);  // now both are silent
  m.set_epoch(4);
  EXPECT_THROW(
      {
        while (auto b = m.next()) m.release(b->slot);
      },
      NoOffloaderError);
  EXPECT_EQ(m.live_daemons(), 0u);

  // Resumed, the dropped daemons write the batches of their last leases late:
  // into memory set aside, never into buffers a new daemon fills.
  d1.kill(SIGCONT);
  d2.kill(SIGCONT);
  DaemonProcess d3(1);
  m.add_daemon("127.0.0.1", d3.port());
  m.set_epoch(5);
  EXPECT_EQ(sorted(drain(m, 5)), sorted(all_samples(5)));
}

// What while_waiting throws leaves next() (a signal in Python); the leases
// stay as they were, and the epoch goes on once the daemon answers.
TEST_F(LeaseManagerTest, WhatWhileWaitingThrowsLeavesNextAndTheEpochGoesOn) {
  struct Interrupted {};
  DaemonProcess d(1);
  LeaseManager m(options());
  m.add_daemon("127.0.0.1", d.port());
  m.set_epoch(5);
  d.kill(SIGSTOP);
  int calls = 0;
  EXPECT_THROW(m.next([&] {
    if (++calls == 3) throw Interrupted{};
  }),
               Interrupted);
  EXPECT_EQ(calls, 3);
  d.kill(SIGCONT);
  EXPECT_EQ(sorted(drain(m, 5)), sorted(all_samples(5)));
  EXPECT_EQ(m.leases_reissued(), 0u);
}

TEST_F(LeaseManagerTest, NoDaemonLeftIsAnErrorAfterTheTimeout) {
  auto o = options();
  o.no_daemon_timeout = 300ms;
  LeaseManager m(o);
  {
    DaemonProcess d(1);
    m.add_daemon("127.0.0.1", d.port());
  }
  m.set_epoch(0);
  try {
    while (auto b = m.next()) m.release(b->slot);
    FAIL() << "expected NoOffloaderError";
  } catch (const NoOffloaderError& e) {
    EXPECT_EQ(e.code(), Errc::kPeerDead);
  }
}

// A trainer that uploads to an accelerator gives the pool the device's
// pinned-host allocator: every batch must land in memory it returned (the
// upload then reads the slot itself), and the memory must go back to it
// when the manager goes.
TEST_F(LeaseManagerTest, BatchesLandInTheMemoryOfTheGivenAllocator) {
  struct Block {
    std::weak_ptr<std::byte> memory;
    std::size_t bytes;
  };
  std::vector<Block> blocks;
  DaemonProcess d1(1), d2(1);
  {
    auto o = options();
    o.allocator = [&blocks](std::size_t bytes) {
      auto memory = page_locked_memory(bytes);
      blocks.push_back({memory, bytes});
      return memory;
    };
    LeaseManager m(o);
    m.add_daemon("127.0.0.1", d1.port());
    m.add_daemon("127.0.0.1", d2.port());
    ASSERT_EQ(blocks.size(), o.prefetch + 2) << "one buffer per slot";
    const auto in_a_block = [&](const void* p, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      return std::any_of(blocks.begin(), blocks.end(), [&](const Block& k) {
        const auto memory = k.memory.lock();
        return memory && b >= memory.get() && b + n <= memory.get() + k.bytes;
      });
    };
    for (const Block& k : blocks) EXPECT_EQ(k.bytes % 4096, 0u);
    m.set_epoch(1);
    std::size_t seen = 0;
    drain(m, 1, [&](std::uint64_t) { ++seen; });
    EXPECT_EQ(seen, m.batch_count());
    m.set_epoch(2);
    while (auto b = m.next()) {
      EXPECT_TRUE(in_a_block(b->images, b->count * m.layout().sample_bytes)) << "batch " << b->position;
      EXPECT_TRUE(in_a_block(b->labels, b->count * 8)) << "batch " << b->position;
      m.release(b->slot);
    }
  }
  for (const Block& k : blocks) EXPECT_TRUE(k.memory.expired()) << "a pool buffer outlived its manager";
}

TEST_F(LeaseManagerTest, AMisalignedPoolAllocatorIsAnError) {
  DaemonProcess d(1);
  auto o = options();
  std::vector<std::shared_ptr<std::byte>> kept;
  o.allocator = [&kept](std::size_t bytes) {
    auto memory = page_locked_memory(bytes + 4096);
    kept.push_back(memory);
    return std::shared_ptr<std::byte>(memory, memory.get() + 8);
  };
  LeaseManager m(o);
  try {
    m.add_daemon("127.0.0.1", d.port());
    FAIL() << "expected kInvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("aligned"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dlop::offload
