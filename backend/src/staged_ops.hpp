// ProcessGroupDlop's calls on accelerator tensors, staged through pinned host
// memory (device_staging.hpp): each stages its tensors, runs the call's host
// entry (ProcessGroupDlop::host_*) on the host copies, and returns a
// WorkDevice that copies the results back. The host half never re-enters the
// public call: the public call has routed, and counts, the whole call.
// ProcessGroupDlop::collective (collective.hpp) stages a call with
// staged_call() unless the call brings a staging of its own: Staged's.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <utility>
#include <vector>

#include "backend/process_group_dlop.hpp"
#include "device_staging.hpp"
#include "work_device.hpp"

namespace dlop::backend::on_device {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;
using CopyBack = std::vector<std::pair<at::Tensor, at::Tensor>>;

// A call's tensors of one shape (a tensor, a list, nested lists) as one list.
inline Tensors listed(const at::Tensor& tensor) { return {tensor}; }
inline const Tensors& listed(const Tensors& tensors) { return tensors; }
inline Tensors listed(const TensorLists& lists) { return flatten(lists); }

// Pinned host copies of a call's inputs, of the same shape.
inline at::Tensor to_host(DeviceCall& call, const at::Tensor& tensor) { return call.to_host(tensor); }
template <class T>
std::vector<T> to_host(DeviceCall& call, const std::vector<T>& list) {
  std::vector<T> host;
  for (const auto& t : list) host.push_back(to_host(call, t));
  return host;
}

// Host tensors the host operation fills, of the outputs' shape, each copied
// back to its device tensor.
inline at::Tensor outputs_of(DeviceCall& call, const at::Tensor& tensor, CopyBack& copy_back) {
  auto host = call.host_like(tensor);
  copy_back.emplace_back(tensor, host);
  return host;
}
template <class T>
std::vector<T> outputs_of(DeviceCall& call, const std::vector<T>& list, CopyBack& copy_back) {
  std::vector<T> host;
  for (const auto& t : list) host.push_back(outputs_of(call, t, copy_back));
  return host;
}

// Runs `host_call` as one host operation once the inputs staged so far have
// arrived: the engine waits for them, never the caller.
template <class HostCall>
WorkPtr one_step(ProcessGroupDlop& pg, c10d::OpType type, DeviceCall& call, Tensors outputs, CopyBack copy_back,
                 HostCall&& host_call) {
  WorkPtr host;
  {
    const DeviceScope scope(call.staged());
    host = host_call();
  }
  auto work = c10::make_intrusive<WorkDevice>(pg.getRank(), type, call, std::move(outputs));
  work->start({{std::move(host), std::move(copy_back)}});
  return work;
}

// `host(host_outputs, host_inputs)`, a host entry of `pg`, on `host_inputs`
// (staged by `call`) and host tensors for `outputs`, copied back once done.
template <class Out, class In, class Host>
WorkPtr staged_call(ProcessGroupDlop& pg, DeviceCall& call, c10d::OpType type, const Out& outputs, In host_inputs,
                    Host&& host) {
  CopyBack copy_back;
  auto host_outputs = outputs_of(call, outputs, copy_back);
  return one_step(pg, type, call, listed(outputs), std::move(copy_back),
                  [&] { return host(host_outputs, host_inputs); });
}

// The same with the inputs copied out as they are.
template <class Out, class In, class Host>
WorkPtr staged_call(ProcessGroupDlop& pg, c10::Device device, c10d::OpType type, const Out& outputs,
                    const In& inputs, Host&& host) {
  DeviceCall call(device);
  return staged_call(pg, call, type, outputs, to_host(call, inputs), host);
}

// The calls staged their own way (staged_ops.cpp says how); a friend of
// ProcessGroupDlop, as their host halves go straight to its host entries.
struct Staged {
  static WorkPtr allreduce(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors,
                           const c10d::AllreduceOptions& opts);
  static WorkPtr allreduce_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors,
                                     const c10d::AllreduceCoalescedOptions& opts);
  static WorkPtr broadcast(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors,
                           const c10d::BroadcastOptions& opts);
  static WorkPtr reduce(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, const c10d::ReduceOptions& opts);
  static WorkPtr allgather_coalesced(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs,
                                     Tensors& inputs, const c10d::AllgatherOptions& opts);
  static WorkPtr scatter(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, TensorLists& inputs,
                         const c10d::ScatterOptions& opts);
  static WorkPtr reduce_scatter(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, TensorLists& inputs,
                                const c10d::ReduceScatterOptions& opts);
  static WorkPtr reduce_scatter_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output,
                                     at::Tensor& input, const c10d::ReduceScatterOptions& opts);
  static WorkPtr reduce_scatter_tensor_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs,
                                                 Tensors& inputs, const c10d::ReduceScatterOptions& opts);
  static WorkPtr alltoall(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                          const c10d::AllToAllOptions& opts);
};

}  // namespace dlop::backend::on_device
