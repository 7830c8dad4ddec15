// All-to-all, all-to-all-v and barrier between real processes: ranks x counts
// x a few dtypes, uneven and empty blocks, in place, several operations in
// flight at once, and a barrier that is shown to wait for a late rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <thread>

#include "collectives/registry.hpp"
#include "common/coll_harness.hpp"
#include "common/multiprocess.hpp"

namespace dlop::coll {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kCounts[] = {0, 1, 7, 1023, (1u << 20) + 3};
constexpr std::uint8_t kGuard = 0xEE;

template <typename Body>
void on_ranks(int ranks, Body body) {
  test::run_on_group(ranks, [&body](transport::Bootstrap& b, const Group& group, const auto& next_tag) {
    body(b, group, next_tag);
  });
}

// Byte i of the block that rank src sends to rank dst.
std::uint8_t pattern(int src, int dst, std::size_t i) {
  return static_cast<std::uint8_t>((i * 131u + i / 251u) ^ static_cast<std::size_t>(src * 37 + dst * 11 + 1));
}

// alltoallv: elements rank src sends to rank dst; uneven, and zero for about a quarter of the pairs.
std::size_t split(int src, int dst, std::size_t scale) {
  if (scale == 0 || (2 * src + dst) % 4 == 1) return 0;
  return scale + static_cast<std::size_t>(src * 3 + dst);
}

// Fills send, runs the operation, checks recv; counts[r] / send_counts[r] in elements.
void exchange_once(const Group& g, transport::Tag tag, CollKind kind, DataType dtype,
                   const std::vector<std::size_t>& send_counts, const std::vector<std::size_t>& counts,
                   bool in_place) {
  const int n = g.size(), me = g.rank();
  const std::size_t es = dtype_size(dtype);
  const std::size_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0}) * es;
  const std::size_t recv_total = std::accumulate(counts.begin(), counts.end(), std::size_t{0}) * es;
  std::vector<std::uint8_t> send(send_total), recv(std::max(send_total, recv_total) + 8, kGuard);
  for (std::size_t dst = 0, at = 0; dst < send_counts.size(); at += send_counts[dst] * es, ++dst) {
    for (std::size_t i = 0; i < send_counts[dst] * es; ++i) send[at + i] = pattern(me, static_cast<int>(dst), i);
  }
  CollArgs args;
  args.kind = kind;
  args.dtype = dtype;
  args.count = kind == CollKind::kAlltoall ? counts[0] : 0;
  args.counts = counts;
  args.send_counts = send_counts;
  args.send = send.data();
  args.recv = recv.data();
  if (in_place) {
    std::copy(send.begin(), send.end(), recv.begin());
    args.send = recv.data();
  }
  test::run_collective(g, args, "pairwise", tag);
  std::size_t at = 0;
  for (int src = 0; src < n; at += counts[src] * es, ++src) {
    for (std::size_t i = 0; i < counts[src] * es; ++i) {
      if (recv[at + i] != pattern(src, me, i)) {
        ADD_FAILURE() << kind_name(kind) << " " << dtype_name(dtype) << (in_place ? " in place" : "")
                      << ": block from rank " << src << " wrong at byte " << i;
        return;
      }
    }
  }
  if (!in_place || send_total <= recv_total) {
    const auto end = recv.begin() + static_cast<long>(recv_total);
    EXPECT_TRUE(std::all_of(end, end + 8, [](std::uint8_t x) { return x == kGuard; })) << "wrote past the end";
  }
}

class ExchangeGrid : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(ExchangeGrid, AlltoallMatchesReference) {
  const auto [ranks, count] = GetParam();
  on_ranks(ranks, [count = count](transport::Bootstrap&, const Group& g, auto next_tag) {
    const std::vector<std::size_t> counts(static_cast<std::size_t>(g.size()), count);
    for (const DataType dtype : {DataType::kUInt8, DataType::kFloat16, DataType::kFloat32, DataType::kInt64}) {
      exchange_once(g, next_tag(), CollKind::kAlltoall, dtype, counts, counts, false);
    }
    exchange_once(g, next_tag(), CollKind::kAlltoall, DataType::kFloat32, counts, counts, true);
  });
}

TEST_P(ExchangeGrid, AlltoallvUnevenAndEmptyBlocks) {
  const auto [ranks, scale] = GetParam();
  on_ranks(ranks, [scale = scale](transport::Bootstrap&, const Group& g, auto next_tag) {
    const int n = g.size(), me = g.rank();
    std::vector<std::size_t> send_counts, counts, mirrored_send, mirrored;
    for (int r = 0; r < n; ++r) {
      send_counts.push_back(split(me, r, scale));
      counts.push_back(split(r, me, scale));
      mirrored_send.push_back(split(r, me, scale));  // the transposed pattern: big senders become big receivers
      mirrored.push_back(split(me, r, scale));
    }
    for (const DataType dtype : {DataType::kUInt8, DataType::kInt32, DataType::kFloat64}) {
      exchange_once(g, next_tag(), CollKind::kAlltoallv, dtype, send_counts, counts, false);
      exchange_once(g, next_tag(), CollKind::kAlltoallv, dtype, mirrored_send, mirrored, false);
    }
    exchange_once(g, next_tag(), CollKind::kAlltoallv, DataType::kInt32, send_counts, counts, true);
  });
}

INSTANTIATE_TEST_SUITE_P(RanksByCounts, ExchangeGrid,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::ValuesIn(kCounts)),
                         [](const auto& param_info) {
                           return "ranks" + std::to_string(std::get<0>(param_info.param)) + "_count" +
                                  std::to_string(std::get<1>(param_info.param));
                         });

class Barrier : public ::testing::TestWithParam<int> {};

TEST_P(Barrier, CompletesRepeatedly) {
  on_ranks(GetParam(), [](transport::Bootstrap&, const Group& g, auto next_tag) {
    CollArgs args;  // kBarrier
    for (int i = 0; i < 20; ++i) test::run_collective(g, args, "dissemination", next_tag());
  });
}

// The last rank enters 300 ms late and sets a store key just before it does;
// every other rank must find that key at once when it leaves the barrier.
TEST_P(Barrier, NoRankLeavesBeforeTheLastHasEntered) {
  on_ranks(GetParam(), [](transport::Bootstrap& b, const Group& g, auto next_tag) {
    CollArgs args;  // kBarrier
    test::run_collective(g, args, "dissemination", next_tag());  // all ranks up (mesh built)
    const bool late = g.rank() == g.size() - 1;
    const auto start = std::chrono::steady_clock::now();
    if (late) {
      std::this_thread::sleep_for(300ms);
      b.set("entered", transport::Bytes{1});
    }
    test::run_collective(g, args, "dissemination", next_tag());
    if (late) return;
    EXPECT_NO_THROW(b.get("entered", 0ms)) << "rank " << g.rank() << " left the barrier before the last rank entered";
    EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Barrier, ::testing::Values(1, 2, 3, 4, 5));

// An alltoall, an alltoallv and two barriers in flight at once on one group,
// with distinct base tags, progressed round-robin from a different start per rank.
TEST(Exchange, SeveralInFlightOnOneGroupWithDistinctTags) {
  on_ranks(5, [](transport::Bootstrap&, const Group& g, auto) {
    const int n = g.size(), me = g.rank();
    constexpr std::size_t kCount = 4099;
    std::vector<std::uint8_t> a_send(n * kCount), a_recv(n * kCount), v_send, v_recv;
    std::vector<std::size_t> send_counts, counts;
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < kCount; ++i) a_send[r * kCount + i] = pattern(me, r, i);
      for (std::size_t i = 0; i < split(me, r, 999); ++i) v_send.push_back(pattern(me + 50, r, i));
      send_counts.push_back(split(me, r, 999));
      counts.push_back(split(r, me, 999));
    }
    v_recv.resize(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    CollArgs a{.kind = CollKind::kAlltoall, .send = a_send.data(), .recv = a_recv.data(), .count = kCount};
    CollArgs v{.kind = CollKind::kAlltoallv, .send = v_send.data(), .recv = v_recv.data(), .counts = counts,
               .send_counts = send_counts};
    CollArgs barrier;
    const std::vector<test::InFlight> ops = {
        {barrier, "dissemination"}, {a, "pairwise"}, {v, "pairwise"}, {barrier, "dissemination"}};
    test::run_interleaved(g, ops, 3, static_cast<std::size_t>(me));
    std::size_t at = 0;
    for (int src = 0; src < n; at += counts[src], ++src) {
      for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(a_recv[src * kCount + i], pattern(src, me, i)) << src;
      for (std::size_t i = 0; i < counts[src]; ++i) ASSERT_EQ(v_recv[at + i], pattern(src + 50, me, i)) << src;
    }
  });
}

}  // namespace
}  // namespace dlop::coll
