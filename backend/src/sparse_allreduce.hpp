// ProcessGroupDlop::allreduce of a sparse COO tensor.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <functional>
#include <vector>

#include "scheduler/communicator.hpp"

namespace dlop::backend {

// The gathers of a sparse all-reduce and how its Work finishes.
struct SparseGathers {
  std::vector<sched::Handle> handles;
  std::vector<at::Tensor> keep_alive;
  std::function<void()> finish;
};

// allreduce of a sparse COO tensor, as Gloo does it (SUM only): every rank's
// coalesced indices and values gathered, then summed by coalescing.
SparseGathers start_sparse_allreduce(sched::Communicator& comm, const at::Tensor& tensor,
                                     const c10d::AllreduceOptions& opts, const sched::OpOptions& options);

}  // namespace dlop::backend
