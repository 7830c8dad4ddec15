// Reduction kernels: every instruction set the CPU runs (scalar, AVX2, AVX-512)
// against references computed another way (floats in double, integers in
// 64-bit), over every dtype x op, counts around the vector widths, misaligned
// buffers and dst aliasing a or b; and the scalar f16/bf16 conversions,
// exhaustively and against F16C.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <fmt/format.h>

#include "reduce_kernels.hpp"  // private to collectives: white-box
#include "collectives/reduce.hpp"
#include "core/error.hpp"

namespace dlop::coll {
namespace {

using Byte = unsigned char;
using detail::ReduceKernels;

constexpr DataType kAllDtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
                                   DataType::kInt8,    DataType::kUInt8,   DataType::kInt16,   DataType::kInt32,
                                   DataType::kInt64,   DataType::kBool};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProd, ReduceOp::kMin,
                                ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor,  ReduceOp::kBxor};
constexpr std::size_t kCounts[] = {0, 1, 7, 31, 1023, 65537};

// ---------------------------------------------------------------------------
// Hardware references (F16C), callable from this file compiled without -mf16c.

#if defined(__x86_64__)
bool cpu_has_f16c() { return __builtin_cpu_supports("f16c"); }
[[gnu::target("f16c")]] std::uint16_t f16c_from_float(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
[[gnu::target("f16c")]] float f16c_to_float(std::uint16_t h) { return _cvtsh_ss(h); }
#else
bool cpu_has_f16c() { return false; }
std::uint16_t f16c_from_float(float) { return 0; }
float f16c_to_float(std::uint16_t) { return 0; }
#endif

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// The value of a half bit pattern, computed from the IEEE definition. For
// exponent 31 and mantissa 0 this gives 2^16, the "next" value after 65504.
double half_value(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(mant + 1024, exp - 25);
  return (h & 0x8000) != 0 ? -mag : mag;
}
// Same for bf16 (0x7F80 gives 2^128).
double bf16_value(std::uint16_t b) {
  const int exp = (b >> 7) & 0xFF;
  const int mant = b & 0x7F;
  const double mag = exp == 0 ? std::ldexp(mant, -133) : std::ldexp(mant + 128, exp - 134);
  return (b & 0x8000) != 0 ? -mag : mag;
}

// ---------------------------------------------------------------------------
// Conversions

TEST(ReduceConversions, HalfToFloatIsExactForAllBitPatternsAndRoundTrips) {
  const bool f16c = cpu_has_f16c();
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float f = detail::half_to_float(h);
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    if (nan) {
      // Quietened, payload kept in the top mantissa bits, as VCVTPH2PS does.
      const std::uint32_t expect = (static_cast<std::uint32_t>(h & 0x8000) << 16) | 0x7FC00000u |
                                   (static_cast<std::uint32_t>(h & 0x3FF) << 13);
      ASSERT_EQ(bits_of(f), expect) << fmt::format("half {:#06x}", h);
      ASSERT_EQ(detail::float_to_half(f), h | 0x200) << fmt::format("half {:#06x}", h);
    } else {
      const double v = (h & 0x7FFF) == 0x7C00 ? ((h & 0x8000) ? -INFINITY : INFINITY) : half_value(h);
      ASSERT_EQ(bits_of(f), bits_of(static_cast<float>(v))) << fmt::format("half {:#06x}", h);
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0);
      ASSERT_EQ(detail::float_to_half(f), h) << fmt::format("half {:#06x}", h);
    }
    if (f16c) {
      ASSERT_EQ(bits_of(f), bits_of(f16c_to_float(h))) << fmt::format("half {:#06x}", h);
    }
  }
}

TEST(ReduceConversions, FloatToHalfRoundsTiesToEvenAtEveryHalfAndOverflows) {
  for (std::uint16_t h = 0; h < 0x7C00; ++h) {  // each positive finite half and the next one up
    const auto up = static_cast<std::uint16_t>(h + 1);
    const auto mid = static_cast<float>((half_value(h) + half_value(up)) / 2);  // exact in float
    const std::uint16_t even = (h & 1) == 0 ? h : up;
    const std::uint16_t expect_up = up == 0x7C00 ? 0x7C00 : up;  // past 65504: inf
    for (const float sign : {1.0f, -1.0f}) {
      const std::uint16_t s = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(detail::float_to_half(sign * mid), s | even) << fmt::format("tie above half {:#06x}", h);
      ASSERT_EQ(detail::float_to_half(sign * std::nextafter(mid, 0.0f)), s | h);
      ASSERT_EQ(detail::float_to_half(sign * std::nextafter(mid, INFINITY)), s | expect_up);
    }
  }
  EXPECT_EQ(detail::float_to_half(65519.996f), 0x7BFF);
  EXPECT_EQ(detail::float_to_half(65520.0f), 0x7C00);
  EXPECT_EQ(detail::float_to_half(1e10f), 0x7C00);
  EXPECT_EQ(detail::float_to_half(-INFINITY), 0xFC00);
  EXPECT_EQ(detail::float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24: even
  EXPECT_EQ(detail::float_to_half(-std::ldexp(1.0f, -26)), 0x8000);
  EXPECT_EQ(detail::float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(ReduceConversions, FloatToHalfMatchesF16cOnMillionsOfFloats) {
  if (!cpu_has_f16c()) GTEST_SKIP() << "no F16C on this CPU";
  std::mt19937_64 rng(42);
  std::uint64_t checked = 0;
  auto check = [&](std::uint32_t bits) {
    const float f = std::bit_cast<float>(bits);
    const std::uint16_t got = detail::float_to_half(f);
    const std::uint16_t want = f16c_from_float(f);
    if (got != want) {
      ADD_FAILURE() << fmt::format("float {:#010x} ({}): ours {:#06x}, F16C {:#06x}", bits, f, got, want);
      return false;
    }
    ++checked;
    return true;
  };
  for (int i = 0; i < 2'000'000; ++i) {  // any bit pattern: NaNs, infinities, float subnormals
    if (!check(static_cast<std::uint32_t>(rng()))) return;
  }
  for (int i = 0; i < 2'000'000; ++i) {  // exponents from below half's subnormals to above its range
    const auto r = rng();
    const std::uint32_t exp = 98 + static_cast<std::uint32_t>(r % 48);  // 2^-29 .. 2^18
    const std::uint32_t bits = static_cast<std::uint32_t>((r >> 8) & 0x807FFFFFu) | (exp << 23);
    if (!check(bits)) return;
  }
  for (std::uint32_t exp = 98; exp < 146; ++exp) {  // ties and their neighbours at each exponent
    for (std::uint32_t low = 0; low < 64; ++low) {
      const std::uint32_t base = (exp << 23) | (low << 13) | 0x1000u;
      for (const std::uint32_t b : {base, base - 1, base + 1, base | 0x80000000u}) {
        if (!check(b)) return;
      }
    }
  }
  EXPECT_GT(checked, 4'000'000u);
}

TEST(ReduceConversions, Bf16RoundTripsAllBitPatterns) {
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const float f = detail::bf16_to_float(b);
    ASSERT_EQ(bits_of(f), i << 16);
    const bool nan = (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0;
    ASSERT_EQ(detail::float_to_bf16(f), nan ? (b | 0x40) : b) << fmt::format("bf16 {:#06x}", b);
  }
}

// Round to nearest even by comparing distances in double.
std::uint16_t bf16_reference(float f) {
  const std::uint32_t bits = bits_of(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  const auto lo = static_cast<std::uint16_t>(bits >> 16);  // toward zero
  const auto hi = static_cast<std::uint16_t>(lo + 1);      // away from zero (0x7F80: 2^128, i.e. inf)
  if ((lo & 0x7FFF) == 0x7F80) return lo;                  // inf
  const double v = f;
  const double dlo = std::fabs(v - bf16_value(lo));
  const double dhi = std::fabs(bf16_value(hi) - v);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) == 0 ? lo : hi;
}

TEST(ReduceConversions, FloatToBf16RoundsToNearestEvenOnMillionsOfFloats) {
  std::mt19937_64 rng(7);
  auto check = [](std::uint32_t bits) {
    const float f = std::bit_cast<float>(bits);
    const std::uint16_t got = detail::float_to_bf16(f);
    const std::uint16_t want = bf16_reference(f);
    EXPECT_EQ(got, want) << fmt::format("float {:#010x} ({})", bits, f);
    return got == want;
  };
  for (int i = 0; i < 2'000'000; ++i) {
    const auto r = static_cast<std::uint32_t>(rng());
    if (!check(r)) return;
    const std::uint32_t tie = (r & 0xFFFF0000u) | 0x8000u;  // exact ties and their neighbours
    if (!check(tie) || !check(tie - 1) || !check(tie + 1)) return;
  }
  for (const std::uint32_t b : {0x7F7F8000u, 0x7F7F7FFFu, 0xFF7F8000u, 0x00008000u, 0x00018000u, 0x7F800000u,
                                0x7F800001u, 0xFFC00001u, 0x00000001u, 0x80000001u}) {
    if (!check(b)) return;
  }
  EXPECT_EQ(detail::float_to_bf16(std::bit_cast<float>(0x7F7F8000u)), 0x7F80);  // tie past the largest: inf
}

// ---------------------------------------------------------------------------
// Typed views of the dtypes: storage type, reference arithmetic, generation.

template <typename T>
T get(const Byte* p, std::size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

double float_reference(ReduceOp op, double a, double b) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin:
      if (std::isnan(a) || std::isnan(b)) return nan;
      if (a == 0 && b == 0) return std::signbit(a) || std::signbit(b) ? -0.0 : 0.0;
      return b < a ? b : a;
    case ReduceOp::kMax:
      if (std::isnan(a) || std::isnan(b)) return nan;
      if (a == 0 && b == 0) return std::signbit(a) && std::signbit(b) ? -0.0 : 0.0;
      return b > a ? b : a;
    default: break;
  }
  ADD_FAILURE() << "no float reference for " << op_name(op);
  return nan;
}

template <typename Derived, typename Stored>
struct FloatKind {
  using S = Stored;
  static constexpr bool kFloat = true;
  static S ref(ReduceOp op, S a, S b) { return Derived::encode(float_reference(op, Derived::decode(a), Derived::decode(b))); }
  static S divided(S v, int n) { return Derived::encode(Derived::decode(v) / n); }
  static bool matches(ReduceOp op, S want, S got) {
    if (Derived::is_nan(want)) {  // min/max give the default NaN; sum/prod/avg some NaN
      return (op == ReduceOp::kMin || op == ReduceOp::kMax) ? Derived::bits(got) == Derived::bits(want)
                                                             : Derived::is_nan(got);
    }
    return Derived::bits(got) == Derived::bits(want);
  }
  static std::string show(S v) { return fmt::format("{:#x} ({})", Derived::bits(v), Derived::decode(v)); }
  // Mostly ordinary values, with specials, arbitrary bit patterns and small
  // integers (which make equal pairs and exact results).
  static S generate(std::mt19937_64& rng) {
    const auto u = rng() % 100;
    if (u < 10) return Derived::kSpecials[rng() % std::size(Derived::kSpecials)];
    if (u < 30) return Derived::from_bits(rng());
    if (u < 50) return Derived::encode(static_cast<double>(static_cast<int>(rng() % 21) - 10));
    return Derived::encode(std::uniform_real_distribution<double>(-1000.0, 1000.0)(rng));
  }
  static S negate(S v) { return Derived::from_bits(Derived::bits(v) ^ Derived::kSignBit); }
};

struct F32Kind : FloatKind<F32Kind, float> {
  static constexpr DataType kType = DataType::kFloat32;
  static constexpr std::uint64_t kSignBit = 0x80000000u;
  static double decode(float v) { return v; }
  static float encode(double d) { return static_cast<float>(d); }
  static std::uint64_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }
  static float from_bits(std::uint64_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b)); }
  static bool is_nan(float v) { return std::isnan(v); }
  static constexpr float kSpecials[] = {
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
      std::numeric_limits<float>::signaling_NaN(), std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(), 0.0f, -0.0f, std::numeric_limits<float>::denorm_min(),
      -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
      std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest(), 1.0f, -1.0f};
};

struct F64Kind : FloatKind<F64Kind, double> {
  static constexpr DataType kType = DataType::kFloat64;
  static constexpr std::uint64_t kSignBit = 0x8000000000000000u;
  static double decode(double v) { return v; }
  static double encode(double d) { return d; }
  static std::uint64_t bits(double v) { return std::bit_cast<std::uint64_t>(v); }
  static double from_bits(std::uint64_t b) { return std::bit_cast<double>(b); }
  static bool is_nan(double v) { return std::isnan(v); }
  static constexpr double kSpecials[] = {
      std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::quiet_NaN(),
      std::numeric_limits<double>::signaling_NaN(), std::numeric_limits<double>::infinity(),
      -std::numeric_limits<double>::infinity(), 0.0, -0.0, std::numeric_limits<double>::denorm_min(),
      -std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::min(),
      std::numeric_limits<double>::max(), std::numeric_limits<double>::lowest(), 1.0, -1.0};
};

// f16 and bf16: decode through the scalar conversions tested above; the
// reference rounds the double result to float, then to the dtype (rounding
// twice is harmless here: 53 >= 2 * 24 + 2 and 24 >= 2 * 11 + 2).
struct F16Kind : FloatKind<F16Kind, std::uint16_t> {
  static constexpr DataType kType = DataType::kFloat16;
  static constexpr std::uint64_t kSignBit = 0x8000u;
  static double decode(std::uint16_t v) { return detail::half_to_float(v); }
  static std::uint16_t encode(double d) { return detail::float_to_half(static_cast<float>(d)); }
  static std::uint64_t bits(std::uint16_t v) { return v; }
  static std::uint16_t from_bits(std::uint64_t b) { return static_cast<std::uint16_t>(b); }
  static bool is_nan(std::uint16_t v) { return (v & 0x7FFF) > 0x7C00; }
  static constexpr std::uint16_t kSpecials[] = {0x7E00, 0xFE00, 0x7C01, 0x7D55, 0x7C00, 0xFC00, 0x0000,
                                                0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF};
};

struct BF16Kind : FloatKind<BF16Kind, std::uint16_t> {
  static constexpr DataType kType = DataType::kBFloat16;
  static constexpr std::uint64_t kSignBit = 0x8000u;
  static double decode(std::uint16_t v) { return detail::bf16_to_float(v); }
  static std::uint16_t encode(double d) { return detail::float_to_bf16(static_cast<float>(d)); }
  static std::uint64_t bits(std::uint16_t v) { return v; }
  static std::uint16_t from_bits(std::uint64_t b) { return static_cast<std::uint16_t>(b); }
  static bool is_nan(std::uint16_t v) { return (v & 0x7FFF) > 0x7F80; }
  static constexpr std::uint16_t kSpecials[] = {0x7FC0, 0xFFC0, 0x7F81, 0x7FAA, 0x7F80, 0xFF80, 0x0000,
                                                0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F};
};

template <typename T, DataType D>
struct IntKind {
  using S = T;
  static constexpr DataType kType = D;
  static constexpr bool kFloat = false;
  static S ref(ReduceOp op, S a, S b) {  // in 64 bits, wrapped back to T
    const std::int64_t x = a, y = b;
    const auto ux = static_cast<std::uint64_t>(x), uy = static_cast<std::uint64_t>(y);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: return static_cast<S>(ux + uy);
      case ReduceOp::kProd: return static_cast<S>(ux * uy);
      case ReduceOp::kMin: return static_cast<S>(x < y ? x : y);
      case ReduceOp::kMax: return static_cast<S>(x < y ? y : x);
      case ReduceOp::kBand: return static_cast<S>(ux & uy);
      case ReduceOp::kBor: return static_cast<S>(ux | uy);
      case ReduceOp::kBxor: return static_cast<S>(ux ^ uy);
    }
    return 0;
  }
  static S divided(S v, int n) { return static_cast<S>(static_cast<std::int64_t>(v) / n); }  // toward zero
  static bool matches(ReduceOp, S want, S got) { return want == got; }
  static std::string show(S v) { return fmt::format("{}", static_cast<std::int64_t>(v)); }
  static S generate(std::mt19937_64& rng) {
    const auto u = rng() % 100;
    if (u < 15) {
      const S extremes[] = {std::numeric_limits<S>::min(), std::numeric_limits<S>::max(), 0, 1, static_cast<S>(-1)};
      return extremes[rng() % std::size(extremes)];
    }
    return static_cast<S>(rng());
  }
  static S negate(S v) { return static_cast<S>(0 - static_cast<std::uint64_t>(v)); }
};

struct BoolKind {
  using S = std::uint8_t;
  static constexpr DataType kType = DataType::kBool;
  static constexpr bool kFloat = false;
  static S ref(ReduceOp op, S a, S b) {
    const bool p = a != 0, q = b != 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
      case ReduceOp::kMax:
      case ReduceOp::kBor: return p || q;
      case ReduceOp::kProd:
      case ReduceOp::kMin:
      case ReduceOp::kBand: return p && q;
      case ReduceOp::kBxor: return p != q;
    }
    return 0;
  }
  static S divided(S v, int) { return v; }  // avg of bool is or; finalize leaves it
  static bool matches(ReduceOp, S want, S got) { return want == got; }
  static std::string show(S v) { return fmt::format("{}", v); }
  static S generate(std::mt19937_64& rng) {  // non-normalised bytes count as true
    const auto u = rng() % 100;
    return u < 40 ? 0 : u < 70 ? 1 : static_cast<S>(rng());
  }
  static S negate(S v) { return static_cast<S>(v == 0); }
};

template <typename Fn>
void with_kind(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat32: return fn(F32Kind{});
    case DataType::kFloat64: return fn(F64Kind{});
    case DataType::kFloat16: return fn(F16Kind{});
    case DataType::kBFloat16: return fn(BF16Kind{});
    case DataType::kInt8: return fn(IntKind<std::int8_t, DataType::kInt8>{});
    case DataType::kUInt8: return fn(IntKind<std::uint8_t, DataType::kUInt8>{});
    case DataType::kInt16: return fn(IntKind<std::int16_t, DataType::kInt16>{});
    case DataType::kInt32: return fn(IntKind<std::int32_t, DataType::kInt32>{});
    case DataType::kInt64: return fn(IntKind<std::int64_t, DataType::kInt64>{});
    case DataType::kBool: return fn(BoolKind{});
  }
}

// Bytes starting `offset` past a 64-byte boundary, fenced by guard bytes that
// a kernel writing past either end would change.
class Buffer {
 public:
  static constexpr Byte kFill = 0xA5;
  static constexpr std::size_t kGuard = 128;

  Buffer(std::size_t bytes, std::size_t offset) : raw_(bytes + offset + 2 * kGuard + 64, kFill), size_(bytes) {
    const auto base = reinterpret_cast<std::uintptr_t>(raw_.data());
    const std::uintptr_t aligned = (base + kGuard + 63) & ~std::uintptr_t{63};
    begin_ = static_cast<std::size_t>(aligned - base) + offset;
  }
  template <typename T>
  Buffer(const std::vector<T>& init, std::size_t offset) : Buffer(init.size() * sizeof(T), offset) {
    if (!init.empty()) std::memcpy(data(), init.data(), size_);
  }
  Byte* data() { return raw_.data() + begin_; }
  const Byte* data() const { return raw_.data() + begin_; }
  bool guards_intact() const {
    for (std::size_t i = 0; i < raw_.size(); ++i) {
      if ((i < begin_ || i >= begin_ + size_) && raw_[i] != kFill) return false;
    }
    return true;
  }

 private:
  std::vector<Byte> raw_;
  std::size_t size_;
  std::size_t begin_;
};

template <typename Kind>
std::vector<typename Kind::S> generate(std::mt19937_64& rng, std::size_t n) {
  std::vector<typename Kind::S> v(n);
  for (auto& x : v) x = Kind::generate(rng);
  return v;
}

// b: independent of a, except for some equal and some opposite pairs.
template <typename Kind>
std::vector<typename Kind::S> generate_partner(std::mt19937_64& rng, const std::vector<typename Kind::S>& a) {
  std::vector<typename Kind::S> b(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto u = rng() % 100;
    b[i] = u < 10 ? a[i] : u < 15 ? Kind::negate(a[i]) : Kind::generate(rng);
  }
  return b;
}

// First element of `got` that differs from `want`, with its inputs.
template <typename Kind>
::testing::AssertionResult matches(ReduceOp op, const std::vector<typename Kind::S>& a,
                                   const std::vector<typename Kind::S>& b, const std::vector<typename Kind::S>& want,
                                   const Byte* got) {
  using S = typename Kind::S;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const S g = get<S>(got, i);
    if (!Kind::matches(op, want[i], g)) {
      return ::testing::AssertionFailure()
             << "element " << i << " of " << want.size() << ": " << Kind::show(a[i]) << " " << op_name(op) << " "
             << Kind::show(b[i]) << " = " << Kind::show(g) << ", want " << Kind::show(want[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<std::size_t> byte_offsets(std::size_t elem) {  // aligned, one element in, one byte in
  if (elem == 1) return {0, 1};
  return {0, elem, 1};
}

// ---------------------------------------------------------------------------
// The grid: dtype (parameter) x op x count x offset x instruction set x aliasing.

class ReduceKernelGrid : public ::testing::TestWithParam<DataType> {};

TEST_P(ReduceKernelGrid, EveryIsaMatchesTheReference) {
  const DataType dtype = GetParam();
  with_kind(dtype, [&](auto kind) {
    using Kind = decltype(kind);
    using S = typename Kind::S;
    std::mt19937_64 rng(1000 + static_cast<int>(dtype));
    for (const ReduceOp op : kAllOps) {
      if (!supports(op, dtype)) {
        std::vector<S> x(4), y(4), z(4);
        for (const std::size_t n : {std::size_t{0}, std::size_t{4}}) {
          try {
            reduce_into(op, dtype, z.data(), x.data(), y.data(), n);
            ADD_FAILURE() << "reduce_into accepted " << op_name(op) << " on " << dtype_name(dtype);
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), Errc::kInvalidArgument);
          }
          try {
            reduce_inplace(op, dtype, z.data(), y.data(), n);
            ADD_FAILURE() << "reduce_inplace accepted " << op_name(op) << " on " << dtype_name(dtype);
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), Errc::kInvalidArgument);
          }
        }
        continue;
      }
      reduce_into(op, dtype, nullptr, nullptr, nullptr, 0);  // count 0 touches nothing
      reduce_inplace(op, dtype, nullptr, nullptr, 0);
      for (const std::size_t n : kCounts) {
        for (const std::size_t offset : byte_offsets(sizeof(S))) {
          SCOPED_TRACE(fmt::format("{} {} count {} offset {} bytes", dtype_name(dtype), op_name(op), n, offset));
          const std::vector<S> a = generate<Kind>(rng, n);
          const std::vector<S> b = generate_partner<Kind>(rng, a);
          std::vector<S> want(n);
          for (std::size_t i = 0; i < n; ++i) want[i] = Kind::ref(op, a[i], b[i]);
          const Buffer in_a(a, offset), in_b(b, offset);

          for (const ReduceKernels* k : detail::runnable_kernels()) {
            if (n == 0) break;  // the kernels' precondition; the public functions are checked below
            SCOPED_TRACE(k->isa);
            Buffer out(n * sizeof(S), offset);
            k->reduce(op, dtype, out.data(), in_a.data(), in_b.data(), n);
            EXPECT_TRUE(matches<Kind>(op, a, b, want, out.data())) << "dst separate";
            EXPECT_TRUE(out.guards_intact()) << "wrote outside dst";

            Buffer into_a(a, offset);
            k->reduce(op, dtype, into_a.data(), into_a.data(), in_b.data(), n);
            EXPECT_TRUE(matches<Kind>(op, a, b, want, into_a.data())) << "dst == a";
            EXPECT_TRUE(into_a.guards_intact());

            Buffer into_b(b, offset);
            k->reduce(op, dtype, into_b.data(), in_a.data(), into_b.data(), n);
            EXPECT_TRUE(matches<Kind>(op, a, b, want, into_b.data())) << "dst == b";
            EXPECT_TRUE(into_b.guards_intact());
          }
          EXPECT_TRUE(n == 0 || std::memcmp(in_a.data(), a.data(), n * sizeof(S)) == 0) << "input a changed";
          EXPECT_TRUE(n == 0 || std::memcmp(in_b.data(), b.data(), n * sizeof(S)) == 0) << "input b changed";

          SCOPED_TRACE(fmt::format("public functions ({})", reduce_isa()));
          Buffer out(n * sizeof(S), offset);
          reduce_into(op, dtype, out.data(), in_a.data(), in_b.data(), n);
          EXPECT_TRUE(matches<Kind>(op, a, b, want, out.data())) << "reduce_into";
          Buffer acc(a, offset);
          reduce_inplace(op, dtype, acc.data(), in_b.data(), n);
          EXPECT_TRUE(matches<Kind>(op, a, b, want, acc.data())) << "reduce_inplace";
          EXPECT_TRUE(out.guards_intact() && acc.guards_intact());
          if (::testing::Test::HasFailure()) return;  // one broken case is enough to read
        }
      }
    }
  });
}

TEST_P(ReduceKernelGrid, AvgFinalizeDividesInTheDtypesPrecision) {
  const DataType dtype = GetParam();
  with_kind(dtype, [&](auto kind) {
    using Kind = decltype(kind);
    using S = typename Kind::S;
    std::mt19937_64 rng(2000 + static_cast<int>(dtype));
    for (const int nranks : {2, 3, 7, 300}) {
      for (const std::size_t n : kCounts) {
        for (const std::size_t offset : byte_offsets(sizeof(S))) {
          SCOPED_TRACE(fmt::format("{} avg over {} ranks, count {} offset {} bytes", dtype_name(dtype), nranks, n,
                                   offset));
          const std::vector<S> v = generate<Kind>(rng, n);
          std::vector<S> want(n);
          for (std::size_t i = 0; i < n; ++i) want[i] = Kind::divided(v[i], nranks);
          for (const ReduceKernels* k : detail::runnable_kernels()) {
            if (n == 0) break;
            SCOPED_TRACE(k->isa);
            Buffer data(v, offset);
            k->divide(dtype, data.data(), n, nranks);
            EXPECT_TRUE(matches<Kind>(ReduceOp::kAvg, v, std::vector<S>(n), want, data.data()));
            EXPECT_TRUE(data.guards_intact());
          }
          Buffer data(v, offset);
          finalize(ReduceOp::kAvg, dtype, data.data(), n, nranks);
          EXPECT_TRUE(matches<Kind>(ReduceOp::kAvg, v, std::vector<S>(n), want, data.data())) << "finalize";
          for (const ReduceOp other : {ReduceOp::kSum, ReduceOp::kMax}) {  // not avg: untouched
            Buffer same(v, offset);
            finalize(other, dtype, same.data(), n, nranks);
            EXPECT_TRUE(n == 0 || std::memcmp(same.data(), v.data(), n * sizeof(S)) == 0);
          }
          Buffer one(v, offset);
          finalize(ReduceOp::kAvg, dtype, one.data(), n, 1);
          EXPECT_TRUE(n == 0 || std::memcmp(one.data(), v.data(), n * sizeof(S)) == 0);
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, ReduceKernelGrid, ::testing::ValuesIn(kAllDtypes),
                         [](const ::testing::TestParamInfo<DataType>& param) {
                           return std::string(dtype_name(param.param));
                         });

}  // namespace
}  // namespace dlop::coll
