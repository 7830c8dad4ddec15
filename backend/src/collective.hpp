// ProcessGroupDlop::collective, the one way in of every call on tensors
// (process_group_collectives.cpp, process_group_dlop.cpp), as
// ProcessGroupNCCL::collective is NCCL's. The staged path never comes back
// here: it runs the call's host entry (host_*) on its host copies.
#pragma once

#include <type_traits>

#include "backend/process_group_dlop.hpp"
#include "device_staging.hpp"
#include "staged_ops.hpp"

namespace dlop::backend {

template <class Out, class In, class Op, class Staged, class Host>
c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::collective(c10d::OpType, const char* name, Out& outputs,
                                                            In& inputs, Op&& op, Staged&& staged, Host&& host) {
  const auto& output_list = on_device::listed(outputs);
  const auto& input_list = on_device::listed(inputs);
  // Where two devices are named, the flat list's comes first.
  const auto device = std::is_same_v<In, on_device::TensorLists> ? call_device({&output_list, &input_list}, name)
                                                                  : call_device({&input_list, &output_list}, name);
  if (auto work = delegated(device, name, [&](c10d::Backend& d) { return op(d, outputs, inputs); })) return *work;
  auto work = device.is_cpu() ? host(outputs, inputs) : staged(device);
  issued(work);
  return work;
}

template <class Out, class In, class Op, class Host>
c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::collective(c10d::OpType type, const char* name, Out& outputs,
                                                            In& inputs, Op&& op, Host&& host) {
  return collective(
      type, name, outputs, inputs, op,
      [&](c10::Device device) { return on_device::staged_call(*this, device, type, outputs, inputs, host); }, host);
}

}  // namespace dlop::backend
