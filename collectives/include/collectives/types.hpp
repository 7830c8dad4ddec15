// Element types and reduction operators the collectives understand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dlop::coll {

enum class DataType : std::uint8_t {
  kFloat32, kFloat64, kFloat16, kBFloat16,
  kInt8, kUInt8, kInt16, kInt32, kInt64, kBool,
};

enum class ReduceOp : std::uint8_t { kSum, kAvg, kProd, kMin, kMax, kBand, kBor, kBxor };

std::size_t dtype_size(DataType dtype);
std::string_view dtype_name(DataType dtype);      // "float", "half", "bfloat16", "int8", ...
std::string_view op_name(ReduceOp op);             // "sum", "avg", ...
bool is_floating(DataType dtype);

// Parses names as dlop-bench and DLOP_ALGO spell them; throws kInvalidArgument.
DataType parse_dtype(std::string_view name);
ReduceOp parse_op(std::string_view name);

// True when the kernels implement op on dtype (bitwise ops: integers and bool only).
bool supports(ReduceOp op, DataType dtype);
// Throws dlop::Error(kInvalidArgument) naming op and dtype when !supports().
void check_reduction(ReduceOp op, DataType dtype);

}  // namespace dlop::coll
