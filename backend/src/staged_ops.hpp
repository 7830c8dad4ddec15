// ProcessGroupDlop's calls on accelerator tensors, staged through pinned host
// memory (device_staging.hpp): each stages its tensors, runs the CPU
// implementation of the same call on the host copies, and returns a
// WorkDevice that copies the results back. Called by the ProcessGroupDlop
// method of the same name when its tensors are on an accelerator.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

namespace dlop::backend {

class ProcessGroupDlop;

namespace on_device {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

WorkPtr allreduce(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, const c10d::AllreduceOptions& opts);
WorkPtr allreduce_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors,
                            const c10d::AllreduceCoalescedOptions& opts);
WorkPtr broadcast(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, const c10d::BroadcastOptions& opts);
WorkPtr reduce(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, const c10d::ReduceOptions& opts);
WorkPtr allgather(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs, Tensors& inputs,
                  const c10d::AllgatherOptions& opts);
WorkPtr allgather_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output, at::Tensor& input,
                       const c10d::AllgatherOptions& opts);
WorkPtr allgather_coalesced(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs, Tensors& inputs,
                            const c10d::AllgatherOptions& opts);
WorkPtr allgather_into_tensor_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                                        const c10d::AllgatherOptions& opts);
WorkPtr gather(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs, Tensors& inputs,
               const c10d::GatherOptions& opts);
WorkPtr scatter(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, TensorLists& inputs,
                const c10d::ScatterOptions& opts);
WorkPtr reduce_scatter(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, TensorLists& inputs,
                       const c10d::ReduceScatterOptions& opts);
WorkPtr reduce_scatter_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output, at::Tensor& input,
                            const c10d::ReduceScatterOptions& opts);
WorkPtr reduce_scatter_tensor_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                                        const c10d::ReduceScatterOptions& opts);
WorkPtr alltoall_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output, at::Tensor& input,
                      std::vector<int64_t>& output_split_sizes, std::vector<int64_t>& input_split_sizes,
                      const c10d::AllToAllOptions& opts);
WorkPtr alltoall(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                 const c10d::AllToAllOptions& opts);
WorkPtr send(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, int dst_rank, int tag);
WorkPtr recv(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, int src_rank, int tag);
WorkPtr recv_anysource(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, int tag);

}  // namespace on_device
}  // namespace dlop::backend
