#include "sparse_allreduce.hpp"

#include <c10/util/accumulate.h>

#include "backend/torch_error.hpp"
#include "backend/work_dlop.hpp"

namespace dlop::backend {

using coll::DataType;

SparseGathers start_sparse_allreduce(sched::Communicator& comm, const at::Tensor& tensor,
                                     const c10d::AllreduceOptions& opts, const sched::OpOptions& options) {
  TORCH_CHECK(tensor.device().is_cpu(), "dlop allreduce: sparse tensors must be on the CPU, got ",
              tensor.device().str());
  DLOP_CHECK_ARG(opts.reduceOp == c10d::ReduceOp::SUM, "dlop allreduce: sparse tensors can only be summed ",
                 "(ReduceOp.SUM, as with Gloo), got ReduceOp ", static_cast<int>(opts.reduceOp.op_));
  const auto input = tensor.coalesce();
  const auto indices = input.indices().t().contiguous();  // nnz x sparse_dim: ranks' rows concatenate
  const auto values = input.values().contiguous();         // nnz x dense sizes

  // Every rank's shape first: the gathers below need everyone's nnz, and
  // tensors that cannot be summed are refused on every rank alike.
  constexpr int64_t kMaxDims = 64;  // torch's own limit
  // One row per rank: nnz, then what must match: sparse and dense dims, dtype, dims, sizes.
  constexpr int64_t kNnz = 0, kSparseDims = 1, kDenseDims = 2, kDtype = 3, kDims = 4, kSizes = 5;
  constexpr int64_t kFields = kSizes + kMaxDims;
  DLOP_CHECK_ARG(input.dim() <= kMaxDims, "dlop allreduce: sparse tensor of ", input.dim(), " dimensions");
  auto meta = at::zeros({kFields}, at::kLong);
  auto* m = meta.data_ptr<int64_t>();
  m[kNnz] = input._nnz();
  m[kSparseDims] = input.sparse_dim();
  m[kDenseDims] = input.dense_dim();
  m[kDtype] = static_cast<int64_t>(input.scalar_type());
  m[kDims] = input.dim();
  for (int64_t d = 0; d < input.dim(); ++d) m[kSizes + d] = input.size(d);
  auto everyone = at::empty({static_cast<int64_t>(comm.size()), kFields}, at::kLong);
  torch_errors([&] {
    comm.allgather(meta.data_ptr(), everyone.data_ptr(), meta.nbytes(), DataType::kUInt8, options).wait();
  });
  std::vector<std::size_t> index_bytes, value_bytes;
  const auto value_row_bytes = static_cast<std::size_t>(c10::multiply_integers(values.sizes().slice(1)) *
                                                        values.element_size());
  int64_t total = 0;
  for (int64_t r = 0; r < comm.size(); ++r) {
    const auto* theirs = everyone[r].data_ptr<int64_t>();
    for (int64_t f = kSparseDims; f < kFields; ++f) {
      DLOP_CHECK_ARG(theirs[f] == m[f], "dlop allreduce: rank ", r, "'s sparse tensor differs from rank ", comm.rank(),
                     "'s (sizes ", c10::IntArrayRef(theirs + kSizes, static_cast<std::size_t>(theirs[kDims])), " vs ",
                     input.sizes(), ", sparse dims ", theirs[kSparseDims], " vs ", m[kSparseDims], ", dtype ",
                     static_cast<c10::ScalarType>(theirs[kDtype]), " vs ", input.scalar_type(), ")");
    }
    index_bytes.push_back(static_cast<std::size_t>(theirs[kNnz] * input.sparse_dim()) * sizeof(int64_t));
    value_bytes.push_back(static_cast<std::size_t>(theirs[kNnz]) * value_row_bytes);
    total += theirs[kNnz];
  }

  auto all_indices = at::empty({total, input.sparse_dim()}, at::kLong);
  auto value_sizes = values.sizes().vec();
  value_sizes[0] = total;
  auto all_values = at::empty(value_sizes, values.options());
  auto handles = torch_errors([&] {
    return std::vector<sched::Handle>{
        comm.allgatherv(indices.data_ptr(), all_indices.data_ptr(), index_bytes, DataType::kUInt8, options),
        comm.allgatherv(values.data_ptr(), all_values.data_ptr(), value_bytes, DataType::kUInt8, options)};
  });
  return {std::move(handles), {indices, values, all_indices, all_values}, [tensor, all_indices, all_values] {
            // Coalescing sums the entries several ranks (or one, twice) hold.
            auto sum = at::sparse_coo_tensor(all_indices.t(), all_values, tensor.sizes(), tensor.options());
            tensor.copy_(sum.coalesce());
          }};
}

}  // namespace dlop::backend
