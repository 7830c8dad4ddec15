// Reduce between real processes: ranks x counts x every (dtype, op) pair the
// kernels define at small counts and representative ones at 1Mi+3, toward the
// first and the last rank, out of place and in place. Inputs are small
// integers (exact in every dtype, so float results are exact too; AVG on
// floats uses inputs whose sum is n times a small integer); the reference
// folds them here in double and int64, not through the kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "collectives/registry.hpp"
#include "common/coll_harness.hpp"
#include "common/multiprocess.hpp"
#include "core/error.hpp"

namespace dlop::coll {
namespace {

using namespace std::chrono_literals;

constexpr std::uint8_t kGuard = 0xEE;

template <typename Body>
void on_ranks(int ranks, Body body) {
  test::run_on_group(ranks, [&body](transport::Bootstrap&, const Group& group, const auto& next_tag) {
    body(group, next_tag);
  });
}

// Exact conversions of small integers (normal numbers or zero) to and from f16 / bf16.
std::uint16_t to_half(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7FFFFFFFu) == 0) return 0;
  const std::uint32_t exponent = ((b >> 23) & 0xFFu) - 127u + 15u;
  return static_cast<std::uint16_t>(((b >> 16) & 0x8000u) | (exponent << 10) | ((b >> 13) & 0x3FFu));
}
float from_half(std::uint16_t h) {
  if ((h & 0x7FFFu) == 0) return 0.0f;
  const std::uint32_t b = (static_cast<std::uint32_t>(h & 0x8000u) << 16) |
                          ((((h >> 10) & 0x1Fu) + 112u) << 23) | (static_cast<std::uint32_t>(h & 0x3FFu) << 13);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

void store(DataType dtype, void* buf, std::size_t i, double v) {
  auto put = [&](auto x) { std::memcpy(static_cast<char*>(buf) + i * sizeof(x), &x, sizeof(x)); };
  float f = static_cast<float>(v);
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  switch (dtype) {
    case DataType::kFloat32: return put(f);
    case DataType::kFloat64: return put(v);
    case DataType::kFloat16: return put(to_half(f));
    case DataType::kBFloat16: return put(static_cast<std::uint16_t>(bits >> 16));
    case DataType::kInt8: return put(static_cast<std::int8_t>(v));
    case DataType::kUInt8: case DataType::kBool: return put(static_cast<std::uint8_t>(v));
    case DataType::kInt16: return put(static_cast<std::int16_t>(v));
    case DataType::kInt32: return put(static_cast<std::int32_t>(v));
    case DataType::kInt64: return put(static_cast<std::int64_t>(v));
  }
}

double load(DataType dtype, const void* buf, std::size_t i) {
  auto get = [&](auto x) {
    std::memcpy(&x, static_cast<const char*>(buf) + i * sizeof(x), sizeof(x));
    return x;
  };
  switch (dtype) {
    case DataType::kFloat32: return get(0.0f);
    case DataType::kFloat64: return get(0.0);
    case DataType::kFloat16: return from_half(get(std::uint16_t{}));
    case DataType::kBFloat16: {
      const std::uint32_t bits = static_cast<std::uint32_t>(get(std::uint16_t{})) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DataType::kInt8: return get(std::int8_t{});
    case DataType::kUInt8: case DataType::kBool: return get(std::uint8_t{});
    case DataType::kInt16: return get(std::int16_t{});
    case DataType::kInt32: return get(std::int32_t{});
    case DataType::kInt64: return static_cast<double>(get(std::int64_t{}));
  }
  return 0;
}

// Rank r's input at index i: small integers (|x| <= 6), 0/1 for bool, >= 0 for uint8.
double input(DataType dtype, ReduceOp op, int n, int rank, std::size_t i) {
  const auto mix = [i](int r) { return static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3) % 20); };
  if (dtype == DataType::kBool) return mix(rank) % 4 != 0 ? 1 : 0;
  if (dtype == DataType::kUInt8) return mix(rank) % 4;
  if (op != ReduceOp::kAvg || !is_floating(dtype)) return mix(rank) % 5 - 2;
  // Floating AVG: base + offsets that cancel, so the mean is exactly `base`.
  const auto offset = [i](int r) { return (static_cast<std::size_t>(r) + i) % 2 != 0 ? 1 : -1; };
  int last = 0;
  for (int r = 0; r < n - 1; ++r) last -= offset(r);
  return static_cast<int>(i * 7 % 5) - 2 + (rank == n - 1 ? last : offset(rank));
}

double expected(DataType dtype, ReduceOp op, int n, std::size_t i) {
  if (dtype == DataType::kBool) {  // sum, avg, max, bor: or; prod, min, band: and
    op = op == ReduceOp::kBxor ? op : (op == ReduceOp::kProd || op == ReduceOp::kMin || op == ReduceOp::kBand)
                                          ? ReduceOp::kMin : ReduceOp::kMax;
  }
  double acc = input(dtype, op, n, 0, i);
  for (int r = 1; r < n; ++r) {
    const double x = input(dtype, op, n, r, i);
    const auto a = static_cast<std::int64_t>(acc), b = static_cast<std::int64_t>(x);
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: acc += x; break;
      case ReduceOp::kProd: acc *= x; break;
      case ReduceOp::kMin: acc = std::min(acc, x); break;
      case ReduceOp::kMax: acc = std::max(acc, x); break;
      case ReduceOp::kBand: acc = static_cast<double>(a & b); break;
      case ReduceOp::kBor: acc = static_cast<double>(a | b); break;
      case ReduceOp::kBxor: acc = static_cast<double>(a ^ b); break;
    }
  }
  if (op != ReduceOp::kAvg) return acc;
  return is_floating(dtype) ? acc / n : static_cast<double>(static_cast<std::int64_t>(acc) / n);
}

// One reduce toward root; checks the root's result and that it wrote nothing past it.
void reduce_once(const Group& g, transport::Tag tag, DataType dtype, ReduceOp op, std::size_t count, int root,
                 bool in_place) {
  const std::size_t es = dtype_size(dtype);
  std::vector<std::uint8_t> send(count * es), recv(g.rank() == root ? count * es + 8 : 0, kGuard);
  for (std::size_t i = 0; i < count; ++i) store(dtype, send.data(), i, input(dtype, op, g.size(), g.rank(), i));
  CollArgs args;
  args.kind = CollKind::kReduce;
  args.dtype = dtype, args.op = op, args.count = count, args.root = root;
  args.send = send.data();
  args.recv = g.rank() == root ? recv.data() : nullptr;
  if (in_place && g.rank() == root) {
    std::copy(send.begin(), send.end(), recv.begin());
    args.send = recv.data();
  }
  test::run_collective(g, args, "binomial", tag);
  if (g.rank() != root) return;
  for (std::size_t i = 0; i < count; ++i) {
    const double want = expected(dtype, op, g.size(), i), got = load(dtype, recv.data(), i);
    if (got != want) {
      ADD_FAILURE() << op_name(op) << " on " << dtype_name(dtype) << " root " << root << (in_place ? " in place" : "")
                    << ": element " << i << " is " << got << ", expected " << want;
      return;
    }
  }
  EXPECT_TRUE(std::all_of(recv.end() - 8, recv.end(), [](std::uint8_t x) { return x == kGuard; })) << "past the end";
}

constexpr std::size_t kLarge = (1u << 20) + 3;

class ReduceGrid : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(ReduceGrid, MatchesReference) {
  const auto [ranks, count] = GetParam();
  on_ranks(ranks, [count = count](const Group& g, auto next_tag) {
    const int n = g.size();
    for (const int root : n == 1 ? std::vector<int>{0} : std::vector<int>{0, n - 1}) {
      if (count < kLarge) {
        for (int d = 0; d <= static_cast<int>(DataType::kBool); ++d) {
          for (int o = 0; o <= static_cast<int>(ReduceOp::kBxor); ++o) {
            const auto dtype = static_cast<DataType>(d);
            const auto op = static_cast<ReduceOp>(o);
            if (supports(op, dtype)) reduce_once(g, next_tag(), dtype, op, count, root, false);
          }
        }
      } else {
        const std::pair<DataType, ReduceOp> kRepresentative[] = {
            {DataType::kFloat32, ReduceOp::kSum}, {DataType::kBFloat16, ReduceOp::kAvg},
            {DataType::kInt32, ReduceOp::kMax},   {DataType::kInt8, ReduceOp::kBxor},
            {DataType::kFloat64, ReduceOp::kProd}, {DataType::kInt64, ReduceOp::kAvg}};
        for (const auto& [dtype, op] : kRepresentative) reduce_once(g, next_tag(), dtype, op, count, root, false);
      }
      reduce_once(g, next_tag(), DataType::kFloat32, ReduceOp::kSum, count, root, true);
      reduce_once(g, next_tag(), DataType::kInt16, ReduceOp::kAvg, count, root, true);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(RanksByCounts, ReduceGrid,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{7},
                                                              std::size_t{1023}, kLarge)),
                         [](const auto& param_info) {
                           return "ranks" + std::to_string(std::get<0>(param_info.param)) + "_count" +
                                  std::to_string(std::get<1>(param_info.param));
                         });

TEST(Reduce, BitwiseOnFloatIsRejectedNamingBoth) {
  on_ranks(1, [](const Group& g, auto next_tag) {
    CollArgs args;
    args.kind = CollKind::kReduce;
    args.dtype = DataType::kFloat32, args.op = ReduceOp::kBxor, args.count = 4;
    try {
      test::find_algorithm(args.kind, "binomial").create(args, g, next_tag());
      ADD_FAILURE() << "bxor on float accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("bxor"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace dlop::coll
