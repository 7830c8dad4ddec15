// The loops of the vector reduction kernels, shared by reduce_avx2.cpp and
// reduce_avx512.cpp (and included by nothing else). Each file describes its
// vectors as "lanes" (L: T, V, kLanes, kBitwise, load, store, and one static
// function per op; optionally load_part/store_part for the first r < kLanes
// elements) and instantiates these loops with them.
//
// Everything here is in an anonymous namespace on purpose: each ISA file gets
// its own copy, compiled with its own -m flags, and no instantiation can be
// merged by the linker with another file's (see reduce_kernels.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "reduce_kernels.hpp"

namespace dlop::coll::detail {
namespace {

using Byte = unsigned char;

// Lanes that can load and store part of a vector (masked): their tails stay
// in vector code; others finish with the scalar kernel.
template <typename L>
concept PartialLanes = requires(const Byte* p, Byte* q, typename L::V v, std::size_t r) {
  L::load_part(p, r);
  L::store_part(q, v, r);
};

// Bool lanes as the kernels define bool (reduce_kernels.hpp), from an ISA's
// logical or, and, xor of vectors of bytes (lor, land, lxor: any non-zero
// byte is true, results are 0 or 1) and its memory access.
template <typename Logic>
struct BoolOps : Logic {
  using T = std::uint8_t;
  using V = typename Logic::V;
  static constexpr bool kBitwise = true;
  static V sum(V a, V b) { return Logic::lor(a, b); }
  static V prod(V a, V b) { return Logic::land(a, b); }
  static V min(V a, V b) { return Logic::land(a, b); }
  static V max(V a, V b) { return Logic::lor(a, b); }
  static V band(V a, V b) { return Logic::land(a, b); }
  static V bor(V a, V b) { return Logic::lor(a, b); }
  static V bxor(V a, V b) { return Logic::lxor(a, b); }
};

// dst = a op b over n elements: four vectors per step, then one, then the tail.
template <typename L, typename L::V (*Op)(typename L::V, typename L::V)>
void reduce_lanes(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, std::size_t n) {
  using V = typename L::V;
  constexpr std::size_t kStep = L::kLanes * sizeof(typename L::T);
  auto* d = static_cast<Byte*>(dst);
  const auto* x = static_cast<const Byte*>(a);
  const auto* y = static_cast<const Byte*>(b);
  std::size_t i = 0;  // elements done
  // dst equal to a or b is fine: each step loads everything before it stores.
  for (; i + 4 * L::kLanes <= n; i += 4 * L::kLanes) {
    const std::size_t o = i * sizeof(typename L::T);
    const V x0 = L::load(x + o), x1 = L::load(x + o + kStep), x2 = L::load(x + o + 2 * kStep),
            x3 = L::load(x + o + 3 * kStep);
    const V y0 = L::load(y + o), y1 = L::load(y + o + kStep), y2 = L::load(y + o + 2 * kStep),
            y3 = L::load(y + o + 3 * kStep);
    L::store(d + o, Op(x0, y0));
    L::store(d + o + kStep, Op(x1, y1));
    L::store(d + o + 2 * kStep, Op(x2, y2));
    L::store(d + o + 3 * kStep, Op(x3, y3));
  }
  for (; i + L::kLanes <= n; i += L::kLanes) {
    const std::size_t o = i * sizeof(typename L::T);
    L::store(d + o, Op(L::load(x + o), L::load(y + o)));
  }
  if (i == n) return;
  const std::size_t o = i * sizeof(typename L::T);
  if constexpr (PartialLanes<L>) {
    const std::size_t r = n - i;
    L::store_part(d + o, Op(L::load_part(x + o, r), L::load_part(y + o, r)), r);
  } else {
    reduce_scalar(op, dtype, d + o, x + o, y + o, n - i);
  }
}

template <typename L>
void reduce_by_op(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, std::size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return reduce_lanes<L, L::sum>(op, dtype, dst, a, b, n);
    case ReduceOp::kProd: return reduce_lanes<L, L::prod>(op, dtype, dst, a, b, n);
    case ReduceOp::kMin: return reduce_lanes<L, L::min>(op, dtype, dst, a, b, n);
    case ReduceOp::kMax: return reduce_lanes<L, L::max>(op, dtype, dst, a, b, n);
    case ReduceOp::kBand:
      if constexpr (L::kBitwise) return reduce_lanes<L, L::band>(op, dtype, dst, a, b, n);
      break;
    case ReduceOp::kBor:
      if constexpr (L::kBitwise) return reduce_lanes<L, L::bor>(op, dtype, dst, a, b, n);
      break;
    case ReduceOp::kBxor:
      if constexpr (L::kBitwise) return reduce_lanes<L, L::bxor>(op, dtype, dst, a, b, n);
      break;
  }
}

// One ISA's lanes for every dtype.
template <typename F32, typename F64, typename F16, typename BF16, template <typename> class Int, typename Bool>
void reduce_by_dtype(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, std::size_t n) {
  switch (dtype) {
    case DataType::kFloat32: return reduce_by_op<F32>(op, dtype, dst, a, b, n);
    case DataType::kFloat64: return reduce_by_op<F64>(op, dtype, dst, a, b, n);
    case DataType::kFloat16: return reduce_by_op<F16>(op, dtype, dst, a, b, n);
    case DataType::kBFloat16: return reduce_by_op<BF16>(op, dtype, dst, a, b, n);
    case DataType::kInt8: return reduce_by_op<Int<std::int8_t>>(op, dtype, dst, a, b, n);
    case DataType::kUInt8: return reduce_by_op<Int<std::uint8_t>>(op, dtype, dst, a, b, n);
    case DataType::kInt16: return reduce_by_op<Int<std::int16_t>>(op, dtype, dst, a, b, n);
    case DataType::kInt32: return reduce_by_op<Int<std::int32_t>>(op, dtype, dst, a, b, n);
    case DataType::kInt64: return reduce_by_op<Int<std::int64_t>>(op, dtype, dst, a, b, n);
    case DataType::kBool: return reduce_by_op<Bool>(op, dtype, dst, a, b, n);
  }
}

template <typename L>
void divide_lanes(DataType dtype, void* data, std::size_t n, int nranks) {
  const typename L::V divisor = L::splat(nranks);
  auto* p = static_cast<Byte*>(data);
  std::size_t i = 0;
  for (; i + L::kLanes <= n; i += L::kLanes) {
    Byte* q = p + i * sizeof(typename L::T);
    L::store(q, L::div(L::load(q), divisor));
  }
  if (i == n) return;
  Byte* q = p + i * sizeof(typename L::T);
  if constexpr (PartialLanes<L>) {
    L::store_part(q, L::div(L::load_part(q, n - i), divisor), n - i);
  } else {
    divide_scalar(dtype, q, n - i, nranks);
  }
}

// Floats divide in their own precision (f16/bf16 in f32); integers are rare
// here and use the scalar truncating division.
template <typename F32, typename F64, typename F16, typename BF16>
void divide_by_dtype(DataType dtype, void* data, std::size_t n, int nranks) {
  switch (dtype) {
    case DataType::kFloat32: return divide_lanes<F32>(dtype, data, n, nranks);
    case DataType::kFloat64: return divide_lanes<F64>(dtype, data, n, nranks);
    case DataType::kFloat16: return divide_lanes<F16>(dtype, data, n, nranks);
    case DataType::kBFloat16: return divide_lanes<BF16>(dtype, data, n, nranks);
    default: return divide_scalar(dtype, data, n, nranks);
  }
}

}  // namespace
}  // namespace dlop::coll::detail
