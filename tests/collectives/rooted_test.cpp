// Broadcast, gather and scatter between real processes: every algorithm x
// ranks x counts x a few dtypes, from the first, a middle and the last rank, in place
// where it applies, checked byte by byte against the senders' patterns.
// Reduce has its own file (rooted_reduce_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "collectives/registry.hpp"
#include "common/coll_harness.hpp"
#include "common/multiprocess.hpp"

namespace dlop::coll {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kCounts[] = {0, 1, 7, 1023, (1u << 20) + 3};
// Element sizes 1, 2, 4 and 8; at the largest count only 1 and 4 (float: the in-place cases), to keep time down.
std::vector<DataType> dtypes(std::size_t count) {
  if (count > 4096) return {DataType::kUInt8, DataType::kFloat32};
  return {DataType::kUInt8, DataType::kFloat16, DataType::kFloat32, DataType::kInt64};
}
constexpr std::uint8_t kGuard = 0xEE;

// Runs body(group, next_tag) on `ranks` processes; every collective gets a fresh base tag.
template <typename Body>
void on_ranks(int ranks, Body body) {
  test::run_on_group(ranks, [&body](transport::Bootstrap&, const Group& group, const auto& next_tag) {
    body(group, next_tag);
  });
}

// First, last, and one in the middle whose binomial subtrees wrap past rank n - 1 (n = 4, 5).
std::vector<int> roots(int n) {
  if (n < 3) return n == 1 ? std::vector<int>{0} : std::vector<int>{0, 1};
  return {0, (n - 1) / 2, n - 1};
}

std::uint8_t pattern(int rank, std::size_t i) {
  return static_cast<std::uint8_t>((i * 131u + i / 251u) ^ (static_cast<std::size_t>(rank) * 37u + 1u));
}
// A buffer of `bytes` pattern bytes of `rank` followed by guard bytes.
std::vector<std::uint8_t> filled(int rank, std::size_t bytes) {
  std::vector<std::uint8_t> v(bytes + 8, kGuard);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = pattern(rank, i);
  return v;
}
// Index of the first byte of got[at, at + bytes) that is not pattern(rank, i - at), or -1.
long mismatch(const std::vector<std::uint8_t>& got, std::size_t at, int rank, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) {
    if (got[at + i] != pattern(rank, i)) return static_cast<long>(i);
  }
  return -1;
}
bool guard_intact(const std::vector<std::uint8_t>& v, std::size_t bytes) {
  return std::all_of(v.begin() + static_cast<long>(bytes), v.end(), [](std::uint8_t x) { return x == kGuard; });
}

CollArgs make_args(CollKind kind, DataType dtype, std::size_t count, int root) {
  CollArgs args;
  args.kind = kind;
  args.dtype = dtype;
  args.count = count;
  args.root = root;
  return args;
}

void broadcast_case(std::string_view algo, int ranks, std::size_t count) {
  on_ranks(ranks, [&](const Group& g, auto next_tag) {
    for (const int root : roots(g.size())) {
      for (const DataType dtype : dtypes(count)) {
        const std::size_t bytes = count * dtype_size(dtype);
        auto buf = g.rank() == root ? filled(root, bytes) : std::vector<std::uint8_t>(bytes + 8, kGuard);
        CollArgs args = make_args(CollKind::kBroadcast, dtype, count, root);
        args.recv = buf.data();
        test::run_collective(g, args, algo, next_tag());
        EXPECT_EQ(mismatch(buf, 0, root, bytes), -1) << dtype_name(dtype) << " root " << root;
        EXPECT_TRUE(guard_intact(buf, bytes)) << "wrote past the end";
      }
    }
  });
}

// How the root passes its own block: apart, send == recv, or inside the other buffer at root * count.
enum class Placement { kApart, kSameBuffer, kOwnBlock };

// One gather or scatter case: where the root's own block goes, its bytes and
// its offset in the root's buffer of all blocks.
struct RootedCase {
  int root;
  DataType dtype;
  Placement place;
  std::size_t block, block_at;
};

// On `ranks` processes, fn(group, next_tag, case) for every root, every dtype
// tried at count, and every placement (those in place in float32 only).
template <typename Fn>
void on_rooted_cases(int ranks, std::size_t count, Fn fn) {
  on_ranks(ranks, [&](const Group& g, auto next_tag) {
    for (const int root : roots(g.size())) {
      for (const DataType dtype : dtypes(count)) {
        for (const Placement place : {Placement::kApart, Placement::kSameBuffer, Placement::kOwnBlock}) {
          if (place != Placement::kApart && dtype != DataType::kFloat32) continue;
          const std::size_t block = count * dtype_size(dtype);
          fn(g, next_tag, RootedCase{root, dtype, place, block, static_cast<std::size_t>(root) * block});
        }
      }
    }
  });
}

void gather_case(std::string_view algo, int ranks, std::size_t count) {
  on_rooted_cases(ranks, count, [&](const Group& g, const auto& next_tag, const RootedCase& c) {
    const auto [root, dtype, place, block, block_at] = c;
    const int n = g.size();
    auto mine = filled(g.rank(), block);
    std::vector<std::uint8_t> all(g.rank() == root ? static_cast<std::size_t>(n) * block + 8 : 0, kGuard);
    CollArgs args = make_args(CollKind::kGather, dtype, count, root);
    args.send = mine.data();
    args.recv = g.rank() == root ? all.data() : nullptr;
    if (g.rank() == root && place != Placement::kApart) {
      std::memcpy(all.data() + block_at, mine.data(), block);
      args.send = place == Placement::kSameBuffer ? all.data() : all.data() + block_at;
    }
    test::run_collective(g, args, algo, next_tag());
    if (g.rank() != root) return;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(mismatch(all, static_cast<std::size_t>(r) * block, r, block), -1)
          << "block of rank " << r << ", " << dtype_name(dtype) << " root " << root << " placement "
          << static_cast<int>(place);
    }
    EXPECT_TRUE(guard_intact(all, static_cast<std::size_t>(n) * block)) << "wrote past the end";
  });
}

void scatter_case(std::string_view algo, int ranks, std::size_t count) {
  on_rooted_cases(ranks, count, [&](const Group& g, const auto& next_tag, const RootedCase& c) {
    const auto [root, dtype, place, block, block_at] = c;
    const int n = g.size();
    std::vector<std::uint8_t> all;  // at the root: the block for rank r is pattern(r, .)
    if (g.rank() == root) {
      for (int r = 0; r < n; ++r) {
        const auto b = filled(r, block);
        all.insert(all.end(), b.begin(), b.begin() + static_cast<long>(block));
      }
    }
    std::vector<std::uint8_t> mine(block + 8, kGuard);
    CollArgs args = make_args(CollKind::kScatter, dtype, count, root);
    args.send = g.rank() == root ? all.data() : nullptr;
    args.recv = mine.data();
    if (g.rank() == root && place != Placement::kApart) {
      args.recv = place == Placement::kSameBuffer ? all.data() : all.data() + block_at;
    }
    test::run_collective(g, args, algo, next_tag());
    const bool in_place = g.rank() == root && place != Placement::kApart;
    const auto& got = in_place ? all : mine;
    EXPECT_EQ(mismatch(got, in_place ? block_at : 0, g.rank(), block), -1)
        << dtype_name(dtype) << " root " << root << " placement " << static_cast<int>(place);
    if (!in_place) {
      EXPECT_TRUE(guard_intact(mine, block)) << "wrote past the end";
    }
  });
}

struct Algo {
  CollKind kind;
  const char* name;
};
void PrintTo(const Algo& algo, std::ostream* os) { *os << kind_name(algo.kind) << ":" << algo.name; }
constexpr Algo kAlgos[] = {
    {CollKind::kBroadcast, "binomial"}, {CollKind::kGather, "linear"},  {CollKind::kGather, "binomial"},
    {CollKind::kScatter, "linear"},     {CollKind::kScatter, "binomial"},
};

class RootedGrid : public ::testing::TestWithParam<std::tuple<Algo, int, std::size_t>> {};

TEST_P(RootedGrid, MatchesReference) {
  const auto [algo, ranks, count] = GetParam();
  switch (algo.kind) {
    case CollKind::kBroadcast: return broadcast_case(algo.name, ranks, count);
    case CollKind::kGather: return gather_case(algo.name, ranks, count);
    case CollKind::kScatter: return scatter_case(algo.name, ranks, count);
    default: FAIL() << "not a rooted collective";
  }
}

INSTANTIATE_TEST_SUITE_P(AlgosByRanksByCounts, RootedGrid,
                         ::testing::Combine(::testing::ValuesIn(kAlgos), ::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::ValuesIn(kCounts)),
                         [](const auto& param_info) {
                           const Algo algo = std::get<0>(param_info.param);
                           return std::string(kind_name(algo.kind)) + "_" + algo.name + "_ranks" +
                                  std::to_string(std::get<1>(param_info.param)) + "_count" +
                                  std::to_string(std::get<2>(param_info.param));
                         });

TEST(Rooted, SeveralInFlightOnOneGroupWithDistinctTags) {
  on_ranks(5, [](const Group& g, auto) {
    const int n = g.size(), me = g.rank();
    constexpr std::size_t kBig = (1u << 20) + 3, kSmall = 1023;
    auto bcast = me == 1 ? filled(1, kBig) : std::vector<std::uint8_t>(kBig + 8, kGuard);
    auto mine = filled(me, kSmall * 4);
    auto other = filled(me + 100, kSmall * 4);  // for the second gather, so that mixed-up tags show
    std::vector<std::uint8_t> gathered(me == 2 ? n * kSmall * 4 + 8 : 0, kGuard), gathered2 = gathered;
    std::vector<std::uint8_t> all, piece(kSmall + 8, kGuard);
    for (int r = 0; me == 3 && r < n; ++r) {
      const auto b = filled(r, kSmall);
      all.insert(all.end(), b.begin(), b.begin() + static_cast<long>(kSmall));
    }
    CollArgs b = make_args(CollKind::kBroadcast, DataType::kUInt8, kBig, 1);
    b.recv = bcast.data();
    CollArgs ga = make_args(CollKind::kGather, DataType::kFloat32, kSmall, 2);
    ga.send = mine.data();
    ga.recv = me == 2 ? gathered.data() : nullptr;
    CollArgs gb = ga;  // another gather to the same root, by the other algorithm
    gb.send = other.data();
    gb.recv = me == 2 ? gathered2.data() : nullptr;
    CollArgs sc = make_args(CollKind::kScatter, DataType::kUInt8, kSmall, 3);
    sc.send = me == 3 ? all.data() : nullptr;
    sc.recv = piece.data();
    test::run_interleaved(g, {{b, "binomial"}, {ga, "linear"}, {gb, "binomial"}, {sc, "binomial"}}, 7,
                          static_cast<std::size_t>(me));
    EXPECT_EQ(mismatch(bcast, 0, 1, kBig), -1);
    EXPECT_EQ(mismatch(piece, 0, me, kSmall), -1);
    for (int r = 0; me == 2 && r < n; ++r) {
      EXPECT_EQ(mismatch(gathered, r * kSmall * 4, r, kSmall * 4), -1) << "linear, from rank " << r;
      EXPECT_EQ(mismatch(gathered2, r * kSmall * 4, r + 100, kSmall * 4), -1) << "binomial, from rank " << r;
    }
  });
}

}  // namespace
}  // namespace dlop::coll
