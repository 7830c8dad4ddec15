// Tensors as the engine's buffer views, with the checks torch users expect
// from Gloo: dense CPU tensors, one per call, matching types and sizes.
// Violations raise ValueError (bad arguments) or RuntimeError (not supported)
// naming the operation, before anything is sent.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string_view>
#include <vector>

#include "collectives/types.hpp"

namespace dlop::backend {

struct BufferView {
  void* data = nullptr;
  std::size_t count = 0;
  coll::DataType dtype = coll::DataType::kUInt8;
};

// Dense, on the CPU (accelerator tensors reach the host path as pinned host copies).
void check_tensor(const at::Tensor& tensor, std::string_view op);
// Exactly one tensor (dlop, like Gloo on CPU, runs one tensor per call).
const at::Tensor& single_tensor(const std::vector<at::Tensor>& tensors, std::string_view op);
void check_same_dtype(const at::Tensor& a, const at::Tensor& b, std::string_view op);

// The tensor as raw bytes, for operations that only move data (any dtype).
BufferView byte_view(const at::Tensor& contiguous);
// The tensor as elements to reduce with `op`; complex tensors become pairs
// of their real type where that is exact (sum, average).
BufferView reduce_view(const at::Tensor& contiguous, const c10d::ReduceOp& op, std::string_view opname);
// The engine's reduction for torch's; PREMUL_SUM is a sum after the caller
// scaled the input (premul_factor).
coll::ReduceOp engine_op(const c10d::ReduceOp& op, std::string_view opname);
// PREMUL_SUM's factor, as a tensor of the input's dtype (or null otherwise).
std::optional<at::Tensor> premul_factor(const c10d::ReduceOp& op, const at::Tensor& like);

// t itself when contiguous, else a contiguous copy (copy it back with
// copy_back once the operation is done).
at::Tensor staged(const at::Tensor& t);
void copy_back(const at::Tensor& user, const at::Tensor& stage);

}  // namespace dlop::backend
