// Reduction kernels: vectorised (AVX2 / AVX-512 chosen at run time), f16 and
// bf16 accumulated in f32. AVG reduces as SUM; finalize() divides once at the end.
#pragma once

#include <cstddef>

#include "collectives/types.hpp"

namespace dlop::coll {

// dst[i] = dst[i] op src[i]
void reduce_inplace(ReduceOp op, DataType dtype, void* dst, const void* src, std::size_t count);
// dst[i] = a[i] op b[i]; dst may alias a or b.
void reduce_into(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, std::size_t count);
// For kAvg: data[i] /= nranks (integers: truncating division); other ops: nothing.
void finalize(ReduceOp op, DataType dtype, void* data, std::size_t count, int nranks);

// The instruction set the kernels dispatched to: "avx512", "avx2" or "scalar".
const char* reduce_isa();

}  // namespace dlop::coll
