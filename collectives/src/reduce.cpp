// Scalar reduction kernels (the reference the vectorised ones must match).
#include "collectives/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.hpp"

namespace dlop::coll {
namespace {

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

std::uint16_t float_to_half(float f) {  // round to nearest even
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0));
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // overflow to inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126 - exp;
    std::uint32_t half = mant >> (shift - 10 + 1 + 12);
    const std::uint32_t rest = mant & ((1u << (shift - 10 + 1 + 12)) - 1);
    const std::uint32_t halfway = 1u << (shift - 10 + 12);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = ((abs - 0x38000000u) >> 13);
  const std::uint32_t rest = abs & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

std::uint16_t float_to_bf16(float f) {  // round to nearest even, NaN stays NaN
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

template <typename T>
T apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<T>(a + b);
    case ReduceOp::kProd: return static_cast<T>(a * b);
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kBand:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(a & b);
      break;
    case ReduceOp::kBor:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(a | b);
      break;
    case ReduceOp::kBxor:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(a ^ b);
      break;
  }
  return a;
}

template <typename T>
void loop(ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) d[i] = apply(op, x[i], y[i]);
}

void loop_bool(ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  auto* d = static_cast<std::uint8_t*>(dst);
  const auto* x = static_cast<const std::uint8_t*>(a);
  const auto* y = static_cast<const std::uint8_t*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    const bool p = x[i] != 0, q = y[i] != 0;
    bool r = false;
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: case ReduceOp::kMax: case ReduceOp::kBor: r = p || q; break;
      case ReduceOp::kProd: case ReduceOp::kMin: case ReduceOp::kBand: r = p && q; break;
      case ReduceOp::kBxor: r = p != q; break;
    }
    d[i] = r ? 1 : 0;
  }
}

template <float (*Load)(std::uint16_t), std::uint16_t (*Store)(float)>
void loop_16(ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  auto* d = static_cast<std::uint16_t*>(dst);
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  for (std::size_t i = 0; i < n; ++i) d[i] = Store(apply(op, Load(x[i]), Load(y[i])));
}

}  // namespace

void reduce_into(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, std::size_t count) {
  check_reduction(op, dtype);
  if (count == 0) return;
  switch (dtype) {
    case DataType::kFloat32: return loop<float>(op, dst, a, b, count);
    case DataType::kFloat64: return loop<double>(op, dst, a, b, count);
    case DataType::kFloat16: return loop_16<half_to_float, float_to_half>(op, dst, a, b, count);
    case DataType::kBFloat16: return loop_16<bf16_to_float, float_to_bf16>(op, dst, a, b, count);
    case DataType::kInt8: return loop<std::int8_t>(op, dst, a, b, count);
    case DataType::kUInt8: return loop<std::uint8_t>(op, dst, a, b, count);
    case DataType::kInt16: return loop<std::int16_t>(op, dst, a, b, count);
    case DataType::kInt32: return loop<std::int32_t>(op, dst, a, b, count);
    case DataType::kInt64: return loop<std::int64_t>(op, dst, a, b, count);
    case DataType::kBool: return loop_bool(op, dst, a, b, count);
  }
}

void reduce_inplace(ReduceOp op, DataType dtype, void* dst, const void* src, std::size_t count) {
  reduce_into(op, dtype, dst, dst, src, count);
}

void finalize(ReduceOp op, DataType dtype, void* data, std::size_t count, int nranks) {
  if (op != ReduceOp::kAvg || nranks <= 1 || count == 0) return;
  auto divide = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(nranks));
  };
  switch (dtype) {
    case DataType::kFloat32: return divide(static_cast<float*>(data));
    case DataType::kFloat64: return divide(static_cast<double*>(data));
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      const bool half = dtype == DataType::kFloat16;
      for (std::size_t i = 0; i < count; ++i) {
        const float v = (half ? half_to_float(p[i]) : bf16_to_float(p[i])) / static_cast<float>(nranks);
        p[i] = half ? float_to_half(v) : float_to_bf16(v);
      }
      return;
    }
    case DataType::kInt8: return divide(static_cast<std::int8_t*>(data));
    case DataType::kUInt8: return divide(static_cast<std::uint8_t*>(data));
    case DataType::kInt16: return divide(static_cast<std::int16_t*>(data));
    case DataType::kInt32: return divide(static_cast<std::int32_t*>(data));
    case DataType::kInt64: return divide(static_cast<std::int64_t*>(data));
    case DataType::kBool: return;
  }
}

const char* reduce_isa() { return "scalar"; }

}  // namespace dlop::coll
