// Inputs and references for the reduction tests (allreduce, reduce_scatter).
//
// Element i of rank r is a deterministic function of (dtype, op, r, i, seed),
// chosen so that every rank can compute every rank's input and so that the
// exact result fits the dtype: small integers for sum/avg/prod (exact in f16
// and bf16 too), a wider range for min/max, raw bit patterns for the bitwise
// ops. The reference folds the ranks' inputs in exact arithmetic (int64 or
// double); only AVG on floats needs a tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "collectives/registry.hpp"
#include "common/coll_harness.hpp"
#include "common/multiprocess.hpp"

namespace dlop::coll::ref {

using namespace std::chrono_literals;

inline constexpr std::size_t kLargeCount = (1u << 20) + 3;
inline constexpr std::uint8_t kGuard = 0xEE;
inline constexpr std::size_t kGuardBytes = 64;

constexpr DataType kAllDtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
                                   DataType::kInt8,    DataType::kUInt8,   DataType::kInt16,   DataType::kInt32,
                                   DataType::kInt64,   DataType::kBool};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProd, ReduceOp::kMin,
                                ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor,  ReduceOp::kBxor};

// fn(dtype, op) for every pair of kAllDtypes x kAllOps the kernels support.
template <typename Fn>
void for_each_supported_pair(Fn&& fn) {
  for (const DataType dtype : kAllDtypes) {
    for (const ReduceOp op : kAllOps) {
      if (supports(op, dtype)) fn(dtype, op);
    }
  }
}

// What the large counts run: one of each kind of kernel, AVG on a 16-bit
// float, in and out of place.
struct Pair {
  DataType dtype;
  ReduceOp op;
  bool in_place;
};
inline constexpr Pair kRepresentativePairs[] = {
    {DataType::kFloat32, ReduceOp::kSum, false}, {DataType::kFloat64, ReduceOp::kMax, true},
    {DataType::kBFloat16, ReduceOp::kAvg, false}, {DataType::kInt64, ReduceOp::kProd, true},
    {DataType::kInt64, ReduceOp::kBxor, false},  {DataType::kUInt8, ReduceOp::kMin, true},
};

// As test::run_collective, but a rank with nothing to do yields the CPU:
// with more ranks than cores, ranks that only spin would wait for the
// scheduler's time slice at every step (about 10x slower at 5 ranks on 2).
void run(const Group& group, const CollArgs& args, std::string_view algorithm, transport::Tag base_tag);

// A unique name for a host arena, agreed through the bootstrap.
std::string agree_on_name(transport::Bootstrap& b);

// body(group, bootstrap, mesh) on `ranks` processes of one host, the group's
// host arena (the shm and inline all-reduces' shared segment) attached.
using ArenaBody = std::function<void(const Group& group, transport::Bootstrap& b, transport::Mesh& mesh)>;
void with_arena(int ranks, const ArenaBody& body, const transport::Mesh::Options& options = {});

// Runs body(group, next_tag) on `ranks` processes; each collective gets a fresh base tag.
template <typename Body>
void on_ranks(int ranks, Body body) {
  test::run_on_group(ranks, [&body](transport::Bootstrap& b, const Group& group, const auto& next_tag) {
    body(group, next_tag, b);
  });
}

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline std::uint64_t hash(std::uint64_t seed, int rank, std::size_t i) {
  return mix(seed ^ (static_cast<std::uint64_t>(rank) << 48) ^ (i * 0xD1B54A32D192ED03ull));
}

// f16 / bf16 of values that are exact in them (the inputs).
inline std::uint16_t exact_half(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFFu) == 0) return static_cast<std::uint16_t>(bits >> 16);
  const std::uint32_t exp = ((bits >> 23) & 0xFFu) - 127 + 15;
  return static_cast<std::uint16_t>(((bits >> 16) & 0x8000u) | (exp << 10) | ((bits >> 13) & 0x3FFu));
}
inline float half_value(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  const float sign = (h & 0x8000u) != 0 ? -1.0f : 1.0f;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) return mant != 0 ? NAN : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
}
inline float bf16_value(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline std::uint16_t to_bf16_truncating(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<std::uint16_t>(bits >> 16);
}

// Input element i of `rank`, as an exact integer (cast to the dtype when stored).
inline std::int64_t input_value(DataType dtype, ReduceOp op, int rank, std::size_t i, std::uint64_t seed) {
  const std::uint64_t h = hash(seed, rank, i);
  const bool is_unsigned = dtype == DataType::kUInt8;
  if (dtype == DataType::kBool) return op == ReduceOp::kProd || op == ReduceOp::kBand ? (h % 8 != 0) : (h & 1);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return is_unsigned ? static_cast<std::int64_t>(h % 17) : static_cast<std::int64_t>(h % 17) - 8;
    case ReduceOp::kProd: {
      const auto v = static_cast<std::int64_t>(1 + h % 2);
      return is_unsigned || (h & 4) == 0 ? v : -v;
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      const auto v = static_cast<std::int64_t>(h % 201);
      return is_unsigned ? v : v - 100;
    }
    default: break;  // bitwise: the raw bits, as the dtype sees them
  }
  switch (dtype) {
    case DataType::kInt8: return static_cast<std::int8_t>(h);
    case DataType::kUInt8: return static_cast<std::uint8_t>(h);
    case DataType::kInt16: return static_cast<std::int16_t>(h);
    case DataType::kInt32: return static_cast<std::int32_t>(h);
    default: return static_cast<std::int64_t>(h);
  }
}

inline void store(DataType dtype, void* base, std::size_t i, std::int64_t v) {
  auto put = [&](auto x) { std::memcpy(static_cast<std::byte*>(base) + i * sizeof(x), &x, sizeof(x)); };
  switch (dtype) {
    case DataType::kFloat32: return put(static_cast<float>(v));
    case DataType::kFloat64: return put(static_cast<double>(v));
    case DataType::kFloat16: return put(exact_half(static_cast<float>(v)));
    case DataType::kBFloat16: return put(to_bf16_truncating(static_cast<float>(v)));
    case DataType::kInt8: return put(static_cast<std::int8_t>(v));
    case DataType::kUInt8:
    case DataType::kBool: return put(static_cast<std::uint8_t>(v));
    case DataType::kInt16: return put(static_cast<std::int16_t>(v));
    case DataType::kInt32: return put(static_cast<std::int32_t>(v));
    case DataType::kInt64: return put(v);
  }
}

// Element i of a buffer: floats as a double, integers exactly.
inline double load_float(DataType dtype, const void* base, std::size_t i) {
  auto get = [&](auto x) {
    std::memcpy(&x, static_cast<const std::byte*>(base) + i * sizeof(x), sizeof(x));
    return x;
  };
  switch (dtype) {
    case DataType::kFloat32: return get(0.0f);
    case DataType::kFloat64: return get(0.0);
    case DataType::kFloat16: return half_value(get(std::uint16_t{}));
    case DataType::kBFloat16: return bf16_value(get(std::uint16_t{}));
    default: return 0;
  }
}
inline std::int64_t load_int(DataType dtype, const void* base, std::size_t i) {
  auto get = [&](auto x) {
    std::memcpy(&x, static_cast<const std::byte*>(base) + i * sizeof(x), sizeof(x));
    return static_cast<std::int64_t>(x);
  };
  switch (dtype) {
    case DataType::kInt8: return get(std::int8_t{});
    case DataType::kUInt8:
    case DataType::kBool: return get(std::uint8_t{});
    case DataType::kInt16: return get(std::int16_t{});
    case DataType::kInt32: return get(std::int32_t{});
    case DataType::kInt64: return get(std::int64_t{});
    default: return 0;
  }
}

// The exact reduction over ranks 0..n-1 of element i (before the dtype's
// wrap-around for integers); for AVG on floats, the exact quotient.
struct Expected {
  std::int64_t exact = 0;
  double quotient = 0;  // AVG on floats only
};
Expected expected_value(DataType dtype, ReduceOp op, int n, std::size_t i, std::uint64_t seed);

// Buffers of `count` elements of rank's input, followed by guard bytes.
std::vector<std::byte> make_input(DataType dtype, ReduceOp op, int rank, std::size_t count, std::uint64_t seed,
                                  std::size_t extra_elements = 0);

// Checks got[0, count) against the reduction of elements [first, first + count)
// over n ranks; one failure naming the first wrong element and how many are.
void check_reduced(DataType dtype, ReduceOp op, int n, const void* got, std::size_t first, std::size_t count,
                   std::uint64_t seed, const std::string& what);

bool guard_intact(const std::vector<std::byte>& buffer, std::size_t bytes);

// --- allreduce cases, shared by the allreduce test files ---

inline std::uint64_t case_seed(DataType dtype, ReduceOp op, std::size_t count) {
  return mix(static_cast<std::uint64_t>(dtype) * 131 + static_cast<std::uint64_t>(op) * 7 + count);
}

inline CollArgs make_allreduce_args(DataType dtype, ReduceOp op, std::size_t count) {
  CollArgs args;
  args.kind = CollKind::kAllreduce;
  args.dtype = dtype;
  args.op = op;
  args.count = count;
  return args;
}

// One allreduce by `algorithm` of this rank's make_input(), in or out of
// place, checked here against the reference, for writes past the end and
// (out of place) for a modified input. Returns the result, guard included.
std::vector<std::byte> checked_allreduce(const Group& group, transport::Tag base_tag, std::string_view algorithm,
                                         DataType dtype, ReduceOp op, std::size_t count, bool in_place);

// Random floats with full mantissas (sums round differently in another
// order) and a few signed zeros (min/max of -0.0 and +0.0 depend on the
// order), small enough that a product over 5 ranks does not overflow.
void fill_random_floats(DataType dtype, void* data, std::size_t count, int rank);

// FNV-1a of the bytes: a cheap fingerprint for comparing results across ranks.
std::uint64_t fingerprint(const void* data, std::size_t bytes);

// "ranks3": the name of a test instantiated over rank counts.
inline std::string ranks_name(const ::testing::TestParamInfo<int>& info) { return "ranks" + std::to_string(info.param); }

inline std::string pair_name(DataType dtype, ReduceOp op) {
  return std::string(dtype_name(dtype)) + "_" + std::string(op_name(op));
}

// --- the block collectives (reduce_scatter[v], allgather[v]) ---

// Where the result goes: a buffer apart, the start of send (send == recv),
// or this rank's block (MPI_IN_PLACE).
enum class Placement { kApart, kSameBuffer, kOwnBlock };

inline const char* placement_name(Placement p) {
  return p == Placement::kApart ? "apart" : p == Placement::kSameBuffer ? "same buffer" : "own block";
}

// Block sizes of n ranks: `count` each, or (the v forms) uneven and some empty.
inline std::vector<std::size_t> block_counts(bool uneven, int n, std::size_t count) {
  std::vector<std::size_t> counts;
  for (int b = 0; b < n; ++b) {
    counts.push_back(!uneven || count == 0 ? count : b % 3 == 1 ? 0 : count + static_cast<std::size_t>(b));
  }
  return counts;
}

// Publishes the fingerprint of this rank's result; expects every rank's to be
// the same (float reductions must not depend on which rank computes them).
void expect_same_bits_on_every_rank(transport::Bootstrap& b, const void* data, std::size_t bytes,
                                    const std::string& what);

// An in-place all-reduce of data (all of it, in elements of dtype) by
// `algorithm`, whose result must then be the same bits on every rank.
void reduce_to_same_bits(transport::Bootstrap& b, const Group& group, std::string_view algorithm,
                         transport::Tag base_tag, DataType dtype, ReduceOp op, std::vector<std::byte>& data);

// --- the host arena's all-reduces (shm, inline), shared by their test files ---

// Element i of rank r in operation k, and the sum over n ranks: exact in int32.
inline std::int32_t seq_value(int rank, int k, std::size_t i) {
  return static_cast<std::int32_t>((i * 31 + static_cast<std::size_t>(k) * 7 + static_cast<std::size_t>(rank)) % 1000);
}
inline std::int32_t seq_sum(int n, int k, std::size_t i) {
  std::int32_t s = 0;
  for (int r = 0; r < n; ++r) s += seq_value(r, k, i);
  return s;
}

// An in-place int32 sum of seq_value(rank, k, .) by `algorithm` into data;
// returns how many elements differ from seq_sum.
std::size_t wrong_in_int32_sum(const Group& group, std::string_view algorithm, int k, std::size_t count,
                               std::vector<std::int32_t>& data);

// Creates one int32 sum for each of counts at once (operation k of
// counts[k], by algorithm_for(its args)) and progresses them in reverse
// order: each waits for its turn, and all finish with their own results.
void expect_in_flight_finish_in_order(const Group& group, const std::vector<std::size_t>& counts,
                                      const std::function<std::string_view(const CollArgs&)>& algorithm_for);

// One rank has no arena (nothing to share): `algorithm` declines a float
// sum of count, and a forced "allreduce:<algorithm>" falls back to the table.
void expect_declines_alone(std::string_view algorithm, std::size_t count);

// On two ranks `algorithm` refuses a bitwise op on count floats at create(),
// before it takes an arena sequence number: a checked float sum of
// then_count by it afterwards still finds the ranks in step.
void expect_refuses_bitwise_on_floats(std::string_view algorithm, std::size_t count, std::size_t then_count);

// Two ranks named as two hosts, each group's arena attached (nothing is
// mapped, each is alone on its host): `algorithm` declines a float sum of count.
void expect_declines_across_hosts(std::string_view algorithm, std::size_t count);

// Three ranks with a 50 ms watchdog sum `count` floats by `algorithm` once;
// rank 2 then dies by SIGKILL and the others' next sum fails within 10 s
// with kPeerDead naming rank 2.
void expect_killed_rank_named(std::string_view algorithm, std::size_t count);

}  // namespace dlop::coll::ref
