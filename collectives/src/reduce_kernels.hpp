// Private to collectives: the per-ISA reduction kernels behind reduce.hpp's
// run-time dispatch, declared here so that tests and micro-benchmarks can call
// every kernel set the CPU can run, not only the one dispatch chose.
//
// This header holds declarations only. It is included by translation units
// compiled with different -m flags (reduce_avx2.cpp, reduce_avx512.cpp), and an
// inline function defined here would be emitted by each of them; the linker
// keeps one copy, possibly the AVX-512 one, which the scalar path would then
// run on a CPU without AVX-512. The same holds for any out-of-line template
// from the standard library: the ISA files use intrinsics, their own
// functions and the loops of reduce_simd.hpp, all in anonymous namespaces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "collectives/types.hpp"

namespace dlop::coll::detail {

// dst[i] = a[i] op b[i] for i < count.
// Preconditions: supports(op, dtype); count > 0; dst is equal to a, equal to b,
// or overlaps neither. Any alignment, even below the element's own.
using ReduceFn = void (*)(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, std::size_t count);
// data[i] /= nranks (finalize of kAvg). Preconditions: count > 0, nranks > 1.
using DivideFn = void (*)(DataType dtype, void* data, std::size_t count, int nranks);

// One instruction set's kernels. Semantics shared by all of them (the scalar
// set is the reference; the others match it bit for bit, NaN payloads of
// sum/prod/avg aside):
// - integers wrap (two's complement), like torch; avg of integers truncates
//   toward zero;
// - f16 and bf16 are computed in f32 and rounded back to nearest even;
// - min/max of floats: a NaN operand gives the default quiet NaN (positive,
//   payload-free), and -0 < +0 (IEEE 754-2019 minimum/maximum), so the result
//   does not depend on operand order and every rank of a collective gets the
//   same bits whatever order it reduced in;
// - bool: sum/max/bor = or, prod/min/band = and, bxor = xor, any non-zero byte
//   reads as true, results are 0 or 1; avg = or, and finalize leaves it alone.
struct ReduceKernels {
  const char* isa;  // "scalar", "avx2", "avx512"
  ReduceFn reduce;
  DivideFn divide;
};

// The kernel sets compiled in and runnable on this CPU, scalar first, best last.
std::span<const ReduceKernels* const> runnable_kernels();
// The set the public functions use: the best runnable one, chosen at first use.
const ReduceKernels& active_kernels();

// Per-ISA entry points (defined only where compiled; reach them through
// runnable_kernels(), which checks the CPU).
const ReduceKernels& scalar_kernels();
const ReduceKernels& avx2_kernels();    // AVX2 + F16C
const ReduceKernels& avx512_kernels();  // AVX-512 F + BW + VL

// The scalar kernels as plain functions: the AVX2 kernels finish their tails with them.
void reduce_scalar(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, std::size_t count);
void divide_scalar(DataType dtype, void* data, std::size_t count, int nranks);

// Scalar conversions, bit-identical to F16C (half) and to the vector kernels:
// round to nearest even; NaN stays NaN with its payload's top bits and the
// quiet bit set (half_to_float quiets a signalling NaN as VCVTPH2PS does;
// bf16_to_float is an exact shift).
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);
float bf16_to_float(std::uint16_t b);
std::uint16_t float_to_bf16(float f);

}  // namespace dlop::coll::detail
