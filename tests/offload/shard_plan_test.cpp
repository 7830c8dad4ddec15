// EpochPlan's shard order: every sample once per epoch across the ranks
// (DistributedSampler's padding or cut), each batch a run of neighbouring
// samples, the same plan from the same inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

#include "core/error.hpp"
#include "offload/lease_manager.hpp"

namespace dlop::offload {
namespace {

using Sizes = std::vector<std::uint64_t>;

EpochPlan shard_plan(const Sizes& sizes, std::uint32_t batch, bool drop, std::uint32_t rank, std::uint32_t world,
                     bool shuffle = true) {
  return EpochPlan{std::accumulate(sizes.begin(), sizes.end(), std::uint64_t{0}), batch, 11, shuffle, drop, rank,
                   world, sizes};
}

// Which shard each sample is in, and whether it is its shard's first or last.
struct Shards {
  std::vector<std::size_t> of;
  std::vector<bool> first, last;
  explicit Shards(const Sizes& sizes) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      for (std::uint64_t i = 0; i < sizes[k]; ++i) {
        of.push_back(k);
        first.push_back(i == 0);
        last.push_back(i + 1 == sizes[k]);
      }
    }
  }
};

const std::vector<Sizes> kSizes = {{}, {0}, {1}, {0, 0}, {13}, {5, 0, 3}, {9, 9, 9}, {2, 7, 1, 4}, {3, 11, 6, 1, 8}};

TEST(ShardPlan, EverySampleOnceAcrossRanksWithEqualCounts) {
  for (const Sizes& sizes : kSizes) {
    const std::uint64_t n = std::accumulate(sizes.begin(), sizes.end(), std::uint64_t{0});
    for (const std::uint32_t batch : {1u, 4u}) {
      for (std::uint32_t world = 1; world <= 4; ++world) {
        for (const bool drop : {false, true}) {
          std::map<std::uint64_t, int> times;
          std::size_t total = 0;
          const std::size_t count = shard_plan(sizes, batch, drop, 0, world).batch_count();
          std::vector<std::size_t> per_rank_samples;
          for (std::uint32_t r = 0; r < world; ++r) {
            const auto bs = shard_plan(sizes, batch, drop, r, world).batches(7);
            ASSERT_EQ(bs.size(), count) << "rank " << r << " world " << world << " n " << n;
            std::size_t mine = 0;
            for (const auto& b : bs) {
              ASSERT_FALSE(b.empty());
              ASSERT_LE(b.size(), batch);
              if (drop) {
                ASSERT_EQ(b.size(), batch);
              }
              for (const auto i : b) {
                ASSERT_LT(i, n);
                ++times[i];
              }
              mine += b.size();
            }
            per_rank_samples.push_back(mine);
            total += mine;
          }
          // Every rank makes as many steps on as many samples.
          EXPECT_EQ(std::count(per_rank_samples.begin(), per_rank_samples.end(), per_rank_samples[0]),
                    static_cast<std::ptrdiff_t>(world));
          if (drop) {
            // No sample twice; fewer than a round of batches (and world) dropped.
            for (const auto& [i, t] : times) EXPECT_EQ(t, 1) << "sample " << i;
            EXPECT_EQ(total, count * batch * world);
            EXPECT_LT(n - total, std::uint64_t{world} * batch + world);
          } else {
            // Every sample; DistributedSampler's padding repeats fewer than world.
            EXPECT_EQ(times.size(), n);
            EXPECT_EQ(total, (n + world - 1) / world * world);
          }
        }
      }
    }
  }
}

TEST(ShardPlan, BatchesAreRunsOfNeighbouringSamples) {
  for (const Sizes& sizes : kSizes) {
    const Shards shards(sizes);
    for (std::uint32_t world = 1; world <= 4; ++world) {
      for (std::uint32_t r = 0; r < world; ++r) {
        const EpochPlan plan = shard_plan(sizes, 4, false, r, world);
        const auto order = plan.order(3);
        for (const auto& b : plan.batches(3)) {
          for (std::size_t k = 1; k < b.size(); ++k) {
            const auto a = b[k - 1], c = b[k];
            const bool next_in_shard = c == a + 1 && shards.of[c] == shards.of[a];
            const bool next_shard = shards.last[a] && shards.first[c];
            const bool padding_wraps = c == order[0];
            EXPECT_TRUE(next_in_shard || next_shard || padding_wraps)
                << "samples " << a << ", " << c << " are not neighbours (rank " << r << ", world " << world << ")";
          }
        }
      }
    }
  }
}

TEST(ShardPlan, OrderShufflesWholeShardsBySeedAndEpoch) {
  const Sizes sizes{3, 11, 6, 1, 8, 5, 2};
  const Shards shards(sizes);
  const EpochPlan plan = shard_plan(sizes, 4, false, 0, 1);
  const auto a = plan.order(1);
  EXPECT_EQ(a, plan.order(1));
  EXPECT_EQ(a, shard_plan(sizes, 4, false, 0, 1).order(1)) << "another plan object, the same inputs";
  EXPECT_NE(a, plan.order(2));
  // Whole shards in some order, each in its own order.
  std::vector<std::size_t> seen;
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (k == 0 || shards.of[a[k]] != shards.of[a[k - 1]]) {
      EXPECT_TRUE(shards.first[a[k]]);
      seen.push_back(shards.of[a[k]]);
    } else {
      EXPECT_EQ(a[k], a[k - 1] + 1);
    }
  }
  std::vector<std::size_t> all(sizes.size());
  std::iota(all.begin(), all.end(), 0);
  EXPECT_NE(seen, all) << "seed 11, epoch 1 should move a shard";
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, all);
  std::vector<std::uint64_t> identity(a.size());
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(shard_plan(sizes, 4, false, 0, 1, false).order(1), identity);
}

TEST(ShardPlan, ShardSizesMustAddUpAndNameThePlan) {
  EpochPlan wrong = shard_plan({4, 4}, 2, false, 0, 1);
  wrong.dataset_size = 9;
  try {
    wrong.batches(0);
    FAIL() << "a plan whose shards miss a sample was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("the shards hold 8 samples, the dataset 9"), std::string::npos) << e.what();
  }
  EXPECT_EQ(EpochPlan{}.shards_digest(), 0u);
  EXPECT_NE(shard_plan({4, 4}, 2, false, 0, 1).shards_digest(), 0u);
  EXPECT_NE(shard_plan({4, 4}, 2, false, 0, 1).shards_digest(), shard_plan({3, 5}, 2, false, 0, 1).shards_digest());
}

TEST(ShardPlan, ACursorOfAnotherShardingIsRefused) {
  LeaseOptions o;
  o.config.batch_size = 2;
  o.shard_sizes = {4, 4};
  LeaseManager m(o);
  Cursor c = m.state();
  EXPECT_EQ(c.shards, m.plan().shards_digest());
  c.position = 1;
  EXPECT_NO_THROW(m.restore(c));
  c.shards = 0;  // the sample order's cursor
  try {
    m.restore(c);
    FAIL() << "a sample-order cursor was applied to a shard-ordered plan";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
  }
}

}  // namespace
}  // namespace dlop::offload
