// Reduction kernels: the public entry points, the run-time dispatch, and the
// scalar kernels (fallback, reference for the vector ones, AVX2 tails).
#include "collectives/reduce.hpp"

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.hpp"
#include "reduce_kernels.hpp"

namespace dlop::coll {
namespace detail {

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits;
  if (exp == 0x1F) {  // inf, or NaN quietened as VCVTPH2PS does
    bits = sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: mant * 2^-24, normalised
      std::uint32_t e = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t float_to_half(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {  // NaN: quiet, top payload bits kept (as VCVTPS2PH)
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  // 65520 = 0x477FF000 is halfway between 65504 (largest half, odd) and 2^16: ties go to inf.
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (abs < 0x38800000u) {  // below 2^-14: half subnormal or zero, in units of 2^-24
    if (abs <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25 (tie to even 0)
    const std::uint32_t exp = abs >> 23;                               // 102 .. 112
    const std::uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;          // value = mant * 2^(exp-150)
    const std::uint32_t shift = 126 - exp;                             // value / 2^-24 = mant >> shift
    std::uint32_t half = mant >> shift;
    const std::uint32_t rest = mant & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;  // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (abs - 0x38000000u) >> 13;  // rebias the exponent 127 -> 15
  const std::uint32_t rest = abs & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent
  return static_cast<std::uint16_t>(sign | half);
}

float bf16_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even; the largest finite values round to inf
  return static_cast<std::uint16_t>(bits >> 16);
}

namespace {

// Elements are read and written through memcpy: callers may hand us buffers
// below the element's alignment, and the compiler's vectoriser must not assume it.
template <typename T>
T load(const void* p, std::size_t i) {
  T v;
  std::memcpy(&v, static_cast<const unsigned char*>(p) + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void store(void* p, std::size_t i, T v) {
  std::memcpy(static_cast<unsigned char*>(p) + i * sizeof(T), &v, sizeof(T));
}

// How an element is stored and what it is computed in.
template <typename T>
struct Plain {
  using Stored = T;
  using Compute = T;
  static T in(T v) { return v; }
  static T out(T v) { return v; }
};
struct Half {
  using Stored = std::uint16_t;
  using Compute = float;
  static float in(std::uint16_t v) { return half_to_float(v); }
  static std::uint16_t out(float v) { return float_to_half(v); }
};
struct BFloat16 {
  using Stored = std::uint16_t;
  using Compute = float;
  static float in(std::uint16_t v) { return bf16_to_float(v); }
  static std::uint16_t out(float v) { return float_to_bf16(v); }
};

template <typename T>
struct IntOps {
  static constexpr bool kBitwise = true;
  // Unsigned arithmetic at least as wide as int: wraps instead of overflowing
  // (int16 * int16 promoted to int could overflow int).
  using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
  static T sum(T a, T b) { return static_cast<T>(static_cast<W>(a) + static_cast<W>(b)); }
  static T prod(T a, T b) { return static_cast<T>(static_cast<W>(a) * static_cast<W>(b)); }
  static T min(T a, T b) { return b < a ? b : a; }
  static T max(T a, T b) { return a < b ? b : a; }
  static T band(T a, T b) { return static_cast<T>(a & b); }
  static T bor(T a, T b) { return static_cast<T>(a | b); }
  static T bxor(T a, T b) { return static_cast<T>(a ^ b); }
};

template <typename F>
struct FloatOps {
  static constexpr bool kBitwise = false;
  using U = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  static F sum(F a, F b) { return a + b; }
  static F prod(F a, F b) { return a * b; }
  // NaN in, default NaN out; of equal values (+0 and -0 compare equal) the
  // sign bits are or-ed (min) or and-ed (max): -0 < +0, whatever the order.
  static F min(F a, F b) {
    if (a != a || b != b) return std::numeric_limits<F>::quiet_NaN();
    if (a == b) return std::bit_cast<F>(static_cast<U>(std::bit_cast<U>(a) | std::bit_cast<U>(b)));
    return a < b ? a : b;
  }
  static F max(F a, F b) {
    if (a != a || b != b) return std::numeric_limits<F>::quiet_NaN();
    if (a == b) return std::bit_cast<F>(static_cast<U>(std::bit_cast<U>(a) & std::bit_cast<U>(b)));
    return a < b ? b : a;
  }
};

struct BoolOps {  // on bytes, any non-zero byte is true, results are 0 or 1
  static constexpr bool kBitwise = true;
  using T = std::uint8_t;
  static T lor(T a, T b) { return (a | b) != 0 ? 1 : 0; }
  static T land(T a, T b) { return a != 0 && b != 0 ? 1 : 0; }
  static T lxor(T a, T b) { return (a != 0) != (b != 0) ? 1 : 0; }
  static T sum(T a, T b) { return lor(a, b); }
  static T prod(T a, T b) { return land(a, b); }
  static T min(T a, T b) { return land(a, b); }
  static T max(T a, T b) { return lor(a, b); }
  static T band(T a, T b) { return land(a, b); }
  static T bor(T a, T b) { return lor(a, b); }
  static T bxor(T a, T b) { return lxor(a, b); }
};

template <typename Codec, typename Codec::Compute (*Op)(typename Codec::Compute, typename Codec::Compute)>
void loop(void* dst, const void* a, const void* b, std::size_t n) {
  using S = typename Codec::Stored;
  for (std::size_t i = 0; i < n; ++i) {
    store<S>(dst, i, Codec::out(Op(Codec::in(load<S>(a, i)), Codec::in(load<S>(b, i)))));
  }
}

template <typename Codec, typename Ops>
void by_op(ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return loop<Codec, Ops::sum>(dst, a, b, n);
    case ReduceOp::kProd: return loop<Codec, Ops::prod>(dst, a, b, n);
    case ReduceOp::kMin: return loop<Codec, Ops::min>(dst, a, b, n);
    case ReduceOp::kMax: return loop<Codec, Ops::max>(dst, a, b, n);
    case ReduceOp::kBand:
      if constexpr (Ops::kBitwise) return loop<Codec, Ops::band>(dst, a, b, n);
      break;
    case ReduceOp::kBor:
      if constexpr (Ops::kBitwise) return loop<Codec, Ops::bor>(dst, a, b, n);
      break;
    case ReduceOp::kBxor:
      if constexpr (Ops::kBitwise) return loop<Codec, Ops::bxor>(dst, a, b, n);
      break;
  }
}

template <typename Codec>
void divide_loop(void* data, std::size_t n, int nranks) {
  using S = typename Codec::Stored;
  using C = typename Codec::Compute;
  const C divisor = static_cast<C>(nranks);
  for (std::size_t i = 0; i < n; ++i) store<S>(data, i, Codec::out(Codec::in(load<S>(data, i)) / divisor));
}

template <typename T>
void divide_int(void* data, std::size_t n, int nranks) {
  // In int64: nranks may not fit T (int8 and 300 ranks); truncates toward zero.
  const std::int64_t divisor = nranks;
  for (std::size_t i = 0; i < n; ++i) store<T>(data, i, static_cast<T>(static_cast<std::int64_t>(load<T>(data, i)) / divisor));
}

}  // namespace

void reduce_scalar(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, std::size_t count) {
  switch (dtype) {
    case DataType::kFloat32: return by_op<Plain<float>, FloatOps<float>>(op, dst, a, b, count);
    case DataType::kFloat64: return by_op<Plain<double>, FloatOps<double>>(op, dst, a, b, count);
    case DataType::kFloat16: return by_op<Half, FloatOps<float>>(op, dst, a, b, count);
    case DataType::kBFloat16: return by_op<BFloat16, FloatOps<float>>(op, dst, a, b, count);
    case DataType::kInt8: return by_op<Plain<std::int8_t>, IntOps<std::int8_t>>(op, dst, a, b, count);
    case DataType::kUInt8: return by_op<Plain<std::uint8_t>, IntOps<std::uint8_t>>(op, dst, a, b, count);
    case DataType::kInt16: return by_op<Plain<std::int16_t>, IntOps<std::int16_t>>(op, dst, a, b, count);
    case DataType::kInt32: return by_op<Plain<std::int32_t>, IntOps<std::int32_t>>(op, dst, a, b, count);
    case DataType::kInt64: return by_op<Plain<std::int64_t>, IntOps<std::int64_t>>(op, dst, a, b, count);
    case DataType::kBool: return by_op<Plain<std::uint8_t>, BoolOps>(op, dst, a, b, count);
  }
}

void divide_scalar(DataType dtype, void* data, std::size_t count, int nranks) {
  switch (dtype) {
    case DataType::kFloat32: return divide_loop<Plain<float>>(data, count, nranks);
    case DataType::kFloat64: return divide_loop<Plain<double>>(data, count, nranks);
    case DataType::kFloat16: return divide_loop<Half>(data, count, nranks);
    case DataType::kBFloat16: return divide_loop<BFloat16>(data, count, nranks);
    case DataType::kInt8: return divide_int<std::int8_t>(data, count, nranks);
    case DataType::kUInt8: return divide_int<std::uint8_t>(data, count, nranks);
    case DataType::kInt16: return divide_int<std::int16_t>(data, count, nranks);
    case DataType::kInt32: return divide_int<std::int32_t>(data, count, nranks);
    case DataType::kInt64: return divide_int<std::int64_t>(data, count, nranks);
    case DataType::kBool: return;  // avg of bool is logical or
  }
}

const ReduceKernels& scalar_kernels() {
  static constexpr ReduceKernels kKernels{"scalar", reduce_scalar, divide_scalar};
  return kKernels;
}

std::span<const ReduceKernels* const> runnable_kernels() {
  struct List {
    std::array<const ReduceKernels*, 3> sets{};
    std::size_t size = 0;
  };
  static const List list = [] {
    List l;
    l.sets[l.size++] = &scalar_kernels();
#if defined(DLOP_REDUCE_HAVE_AVX2) || defined(DLOP_REDUCE_HAVE_AVX512)
    __builtin_cpu_init();  // in case the first call comes from a static initialiser
#endif
#ifdef DLOP_REDUCE_HAVE_AVX2
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) l.sets[l.size++] = &avx2_kernels();
#endif
#ifdef DLOP_REDUCE_HAVE_AVX512
    // libgcc's check includes the OS saving the ZMM state (XCR0).
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2")) {
      l.sets[l.size++] = &avx512_kernels();
    }
#endif
    return l;
  }();
  return {list.sets.data(), list.size};
}

const ReduceKernels& active_kernels() {
  static const ReduceKernels& chosen = *runnable_kernels().back();
  return chosen;
}

}  // namespace detail

void reduce_into(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, std::size_t count) {
  check_reduction(op, dtype);
  if (count == 0) return;
  detail::active_kernels().reduce(op, dtype, dst, a, b, count);
}

void reduce_inplace(ReduceOp op, DataType dtype, void* dst, const void* src, std::size_t count) {
  reduce_into(op, dtype, dst, dst, src, count);
}

void finalize(ReduceOp op, DataType dtype, void* data, std::size_t count, int nranks) {
  if (op != ReduceOp::kAvg || nranks <= 1 || count == 0) return;
  detail::active_kernels().divide(dtype, data, count, nranks);
}

const char* reduce_isa() { return detail::active_kernels().isa; }

}  // namespace dlop::coll
