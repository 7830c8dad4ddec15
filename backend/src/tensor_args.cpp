#include "tensor_args.hpp"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "backend/torch_error.hpp"
#include "backend/torch_version.hpp"

namespace dlop::backend {
namespace {

// PREMUL_SUM's factor: torch < 2.13 names its holder NCCLPreMulSumSupplement
// (2.13 keeps that name as an alias "for BC only").
#if DLOP_TORCH_AT_LEAST(2, 13)
using PreMulSumSupplement = c10d::PreMulSumSupplement;
#else
using PreMulSumSupplement = c10d::NCCLPreMulSumSupplement;
#endif

std::optional<coll::DataType> engine_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return coll::DataType::kFloat32;
    case at::kDouble: return coll::DataType::kFloat64;
    case at::kHalf: return coll::DataType::kFloat16;
    case at::kBFloat16: return coll::DataType::kBFloat16;
    case at::kChar: return coll::DataType::kInt8;
    case at::kByte: return coll::DataType::kUInt8;
    case at::kShort: return coll::DataType::kInt16;
    case at::kInt: return coll::DataType::kInt32;
    case at::kLong: return coll::DataType::kInt64;
    case at::kBool: return coll::DataType::kBool;
    default: return std::nullopt;
  }
}

}  // namespace

void check_tensor(const at::Tensor& tensor, std::string_view op) {
  TORCH_CHECK(tensor.defined(), "dlop ", op, ": undefined tensor");
  // Accelerator tensors are staged or delegated before they get here.
  TORCH_CHECK(tensor.device().is_cpu(), "dlop ", op, ": expected a CPU tensor here, got ", tensor.device().str());
  DLOP_CHECK_ARG(tensor.layout() == at::kStrided, "dlop ", op, ": only dense tensors are supported, got layout ",
                    tensor.layout());
}

const at::Tensor& single_tensor(const std::vector<at::Tensor>& tensors, std::string_view op) {
  DLOP_CHECK_ARG(tensors.size() == 1, "dlop ", op, ": expects exactly one tensor per call, got ", tensors.size());
  check_tensor(tensors[0], op);
  return tensors[0];
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, std::string_view op) {
  DLOP_CHECK_ARG(a.scalar_type() == b.scalar_type(), "dlop ", op, ": mixed dtypes ", a.scalar_type(), " and ",
                    b.scalar_type());
}

BufferView byte_view(const at::Tensor& contiguous) {
  return {contiguous.data_ptr(), contiguous.nbytes(), coll::DataType::kUInt8};
}

BufferView reduce_view(const at::Tensor& contiguous, const c10d::ReduceOp& op, std::string_view opname) {
  if (contiguous.is_complex()) {
    DLOP_CHECK_ARG(op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG || op == c10d::ReduceOp::PREMUL_SUM,
                      "dlop ", opname, ": complex tensors only reduce with SUM, AVG or PREMUL_SUM, not ",
                      static_cast<int>(op.op_));
    const auto real = at::view_as_real(contiguous);
    return reduce_view(real, c10d::ReduceOp::SUM, opname);
  }
  const auto dtype = engine_dtype(contiguous.scalar_type());
  DLOP_CHECK_ARG(dtype.has_value(), "dlop ", opname, ": dtype ", contiguous.scalar_type(),
                    " is not supported for reductions");
  return {contiguous.data_ptr(), static_cast<std::size_t>(contiguous.numel()), *dtype};
}

coll::ReduceOp engine_op(const c10d::ReduceOp& op, std::string_view opname) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return coll::ReduceOp::kSum;
    case c10d::ReduceOp::PREMUL_SUM: return coll::ReduceOp::kSum;
    case c10d::ReduceOp::AVG: return coll::ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT: return coll::ReduceOp::kProd;
    case c10d::ReduceOp::MIN: return coll::ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return coll::ReduceOp::kMax;
    case c10d::ReduceOp::BAND: return coll::ReduceOp::kBand;
    case c10d::ReduceOp::BOR: return coll::ReduceOp::kBor;
    case c10d::ReduceOp::BXOR: return coll::ReduceOp::kBxor;
    default: break;
  }
  std::rethrow_exception(
      torch_error(Errc::kInvalidArgument, c10::str("dlop ", opname, ": unsupported ReduceOp ", static_cast<int>(op.op_))));
}

std::optional<at::Tensor> premul_factor(const c10d::ReduceOp& op, const at::Tensor& like) {
  if (op != c10d::ReduceOp::PREMUL_SUM) return std::nullopt;
  const auto* supplement = dynamic_cast<PreMulSumSupplement*>(op.supplement_.get());
  DLOP_CHECK_ARG(supplement != nullptr, "dlop: PREMUL_SUM without its factor");
  if (supplement->tensor_factor.defined()) {
    check_tensor(supplement->tensor_factor, "PREMUL_SUM factor");
    return supplement->tensor_factor.to(like.scalar_type());
  }
  return at::scalar_tensor(supplement->double_factor, like.options());
}

at::Tensor staged(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

void copy_back(const at::Tensor& user, const at::Tensor& stage) {
  if (!user.is_same(stage)) user.copy_(stage.view(user.sizes()));
}

}  // namespace dlop::backend
