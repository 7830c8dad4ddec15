// Reduction semantics spelled out on every instruction set the CPU runs: NaN
// and signed zeros in min/max, integer wrap-around, every half/bf16 bit
// pattern through each kernel, and which instruction set dispatch chose.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "reduce_kernels.hpp"  // private to collectives: white-box
#include "collectives/reduce.hpp"

namespace dlop::coll {
namespace {

using detail::ReduceKernels;

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// ---------------------------------------------------------------------------
// Semantics spelled out, on every instruction set.

template <typename T>
std::vector<T> run_kernel(const ReduceKernels& k, ReduceOp op, DataType dtype, const std::vector<T>& a,
                          const std::vector<T>& b) {
  std::vector<T> out(a.size());
  k.reduce(op, dtype, out.data(), a.data(), b.data(), a.size());
  return out;
}

TEST(ReduceSemantics, FloatMinMaxPropagateNanAndOrderSignedZerosWhateverTheOperandOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // Pairs chosen so that min_ps/max_ps alone would get each wrong in one order.
  const std::vector<std::pair<float, float>> pairs = {{nan, 1.0f}, {1.0f, nan},  {nan, nan},   {-0.0f, 0.0f},
                                                      {0.0f, -0.0f}, {nan, -inf}, {2.0f, -3.0f}, {-0.0f, -0.0f}};
  std::vector<float> a, b;
  for (int rep = 0; rep < 9; ++rep) {  // 72 elements: full vectors and a tail on every ISA
    for (const auto& [x, y] : pairs) {
      a.push_back(x);
      b.push_back(y);
    }
  }
  for (const ReduceKernels* k : detail::runnable_kernels()) {
    SCOPED_TRACE(k->isa);
    for (const bool swapped : {false, true}) {
      const auto& x = swapped ? b : a;
      const auto& y = swapped ? a : b;
      const auto mn = run_kernel(*k, ReduceOp::kMin, DataType::kFloat32, x, y);
      const auto mx = run_kernel(*k, ReduceOp::kMax, DataType::kFloat32, x, y);
      for (std::size_t i = 0; i < a.size(); ++i) {
        const float p = a[i], q = b[i];
        if (std::isnan(p) || std::isnan(q)) {
          EXPECT_EQ(bits_of(mn[i]), 0x7FC00000u) << i;
          EXPECT_EQ(bits_of(mx[i]), 0x7FC00000u) << i;
        } else if (p == 0 && q == 0) {
          EXPECT_EQ(std::signbit(mn[i]), std::signbit(p) || std::signbit(q)) << i;
          EXPECT_EQ(std::signbit(mx[i]), std::signbit(p) && std::signbit(q)) << i;
        } else {
          EXPECT_EQ(mn[i], std::min(p, q));
          EXPECT_EQ(mx[i], std::max(p, q));
        }
      }
    }
    // The same through f16 and bf16 (computed in f32) and f64.
    const std::vector<std::uint16_t> hnan(37, 0x7E00), hone(37, 0x3C00);
    EXPECT_EQ(run_kernel(*k, ReduceOp::kMin, DataType::kFloat16, hone, hnan), std::vector<std::uint16_t>(37, 0x7E00));
    EXPECT_EQ(run_kernel(*k, ReduceOp::kMax, DataType::kFloat16, hnan, hone), std::vector<std::uint16_t>(37, 0x7E00));
    const std::vector<std::uint16_t> bnan(37, 0xFFC1), bone(37, 0x3F80);
    EXPECT_EQ(run_kernel(*k, ReduceOp::kMin, DataType::kBFloat16, bone, bnan), std::vector<std::uint16_t>(37, 0x7FC0));
    const std::vector<double> dnan(13, std::nan("")), dzero(13, -0.0), dpos(13, 0.0);
    for (const double r : run_kernel(*k, ReduceOp::kMax, DataType::kFloat64, dpos, dnan)) EXPECT_TRUE(std::isnan(r));
    for (const double r : run_kernel(*k, ReduceOp::kMin, DataType::kFloat64, dpos, dzero)) EXPECT_TRUE(std::signbit(r));
    for (const double r : run_kernel(*k, ReduceOp::kMax, DataType::kFloat64, dzero, dpos)) EXPECT_FALSE(std::signbit(r));
  }
}

TEST(ReduceSemantics, IntegersWrapLikeTwosComplement) {
  for (const ReduceKernels* k : detail::runnable_kernels()) {
    SCOPED_TRACE(k->isa);
    const std::vector<std::int32_t> big(40, std::numeric_limits<std::int32_t>::max()), one(40, 1);
    EXPECT_EQ(run_kernel(*k, ReduceOp::kSum, DataType::kInt32, big, one),
              std::vector<std::int32_t>(40, std::numeric_limits<std::int32_t>::min()));
    const std::vector<std::int8_t> sixteen(70, 16), minus(70, -128);
    EXPECT_EQ(run_kernel(*k, ReduceOp::kProd, DataType::kInt8, sixteen, sixteen), std::vector<std::int8_t>(70, 0));
    EXPECT_EQ(run_kernel(*k, ReduceOp::kProd, DataType::kInt8, minus, std::vector<std::int8_t>(70, -1)), minus);
    const std::vector<std::int64_t> x(11, 0x123456789ABCDEF1), y(11, -0x0FEDCBA987654321);
    const auto want = static_cast<std::int64_t>(static_cast<std::uint64_t>(x[0]) * static_cast<std::uint64_t>(y[0]));
    EXPECT_EQ(run_kernel(*k, ReduceOp::kProd, DataType::kInt64, x, y), std::vector<std::int64_t>(11, want));
    const std::vector<std::int16_t> h(20, -32768), g(20, 32767);
    EXPECT_EQ(run_kernel(*k, ReduceOp::kMin, DataType::kInt16, h, g), h);
    EXPECT_EQ(run_kernel(*k, ReduceOp::kProd, DataType::kInt16, h, g), h);  // -2^15 * (2^15 - 1) mod 2^16
  }
}

TEST(ReduceSemantics, HalfAndBf16LoadAndStoreEveryBitPatternOnEveryIsa) {
  // x + (-0) == x for every x (+0 + -0 == +0), NaNs come back quietened: each
  // ISA's f16 and bf16 widening and narrowing, on all 65536 patterns.
  std::vector<std::uint16_t> all(0x10000), minus_zero(0x10000, 0x8000);
  for (std::uint32_t i = 0; i < 0x10000; ++i) all[i] = static_cast<std::uint16_t>(i);
  for (const ReduceKernels* k : detail::runnable_kernels()) {
    SCOPED_TRACE(k->isa);
    const auto half = run_kernel(*k, ReduceOp::kSum, DataType::kFloat16, all, minus_zero);
    const auto bf = run_kernel(*k, ReduceOp::kSum, DataType::kBFloat16, all, minus_zero);
    for (std::uint32_t i = 0; i < 0x10000; ++i) {
      const bool hnan = (i & 0x7FFF) > 0x7C00, bnan = (i & 0x7FFF) > 0x7F80;
      ASSERT_EQ(half[i], hnan ? (i | 0x200) : i) << fmt::format("half {:#06x}", i);
      ASSERT_EQ(bf[i], bnan ? (i | 0x40) : i) << fmt::format("bf16 {:#06x}", i);
    }
  }
}

TEST(ReduceDispatch, ChoosesTheBestInstructionSetTheCpuRuns) {
  const auto kernels = detail::runnable_kernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_STREQ(kernels.front()->isa, "scalar");
  EXPECT_STREQ(reduce_isa(), kernels.back()->isa);
  EXPECT_EQ(&detail::active_kernels(), kernels.back());
  std::string names;
  for (const ReduceKernels* k : kernels) names += std::string(names.empty() ? "" : ", ") + k->isa;
  RecordProperty("runnable", names);
  std::printf("reduction kernels runnable here: %s; dispatched: %s\n", names.c_str(), reduce_isa());
#if defined(__x86_64__)
  // GCC and Clang take all these flags, so what the CPU has is what runs.
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  EXPECT_STREQ(reduce_isa(), avx512 ? "avx512" : avx2 ? "avx2" : "scalar");
  EXPECT_EQ(kernels.size(), 1u + (avx2 ? 1u : 0u) + (avx512 ? 1u : 0u));
#endif
}

}  // namespace
}  // namespace dlop::coll
