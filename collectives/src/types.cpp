#include "collectives/types.hpp"

#include <array>
#include <fmt/format.h>

#include "core/error.hpp"

namespace dlop::coll {
namespace {

struct DtypeInfo {
  DataType dtype;
  std::string_view name;
  std::size_t size;
  bool floating;
};

constexpr std::array<DtypeInfo, 10> kDtypes = {{
    {DataType::kFloat32, "float", 4, true},   {DataType::kFloat64, "double", 8, true},
    {DataType::kFloat16, "half", 2, true},    {DataType::kBFloat16, "bfloat16", 2, true},
    {DataType::kInt8, "int8", 1, false},      {DataType::kUInt8, "uint8", 1, false},
    {DataType::kInt16, "int16", 2, false},    {DataType::kInt32, "int32", 4, false},
    {DataType::kInt64, "int64", 8, false},    {DataType::kBool, "bool", 1, false},
}};

constexpr std::array<std::string_view, 8> kOps = {"sum", "avg", "prod", "min", "max", "band", "bor", "bxor"};

const DtypeInfo& info(DataType dtype) { return kDtypes.at(static_cast<std::size_t>(dtype)); }

}  // namespace

std::size_t dtype_size(DataType dtype) { return info(dtype).size; }
std::string_view dtype_name(DataType dtype) { return info(dtype).name; }
bool is_floating(DataType dtype) { return info(dtype).floating; }
std::string_view op_name(ReduceOp op) { return kOps.at(static_cast<std::size_t>(op)); }

DataType parse_dtype(std::string_view name) {
  if (name == "float32" || name == "f32") return DataType::kFloat32;
  if (name == "float64" || name == "f64") return DataType::kFloat64;
  if (name == "float16" || name == "f16") return DataType::kFloat16;
  if (name == "bf16") return DataType::kBFloat16;
  for (const auto& d : kDtypes) {
    if (d.name == name) return d.dtype;
  }
  throw_error(Errc::kInvalidArgument, fmt::format("unknown data type '{}'", name));
}

ReduceOp parse_op(std::string_view name) {
  for (std::size_t i = 0; i < kOps.size(); ++i) {
    if (kOps[i] == name) return static_cast<ReduceOp>(i);
  }
  throw_error(Errc::kInvalidArgument, fmt::format("unknown reduction '{}'", name));
}

bool supports(ReduceOp op, DataType dtype) {
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  return !(bitwise && is_floating(dtype));
}

void check_reduction(ReduceOp op, DataType dtype) {
  if (!supports(op, dtype)) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("reduction '{}' is not defined on {}: bitwise reductions take integer or bool data",
                            op_name(op), dtype_name(dtype)));
  }
}

}  // namespace dlop::coll
