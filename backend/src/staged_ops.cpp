#include "staged_ops.hpp"

#include <c10/core/StreamGuard.h>

#include <algorithm>

#include "backend/process_group_dlop.hpp"
#include "core/config.hpp"
#include "device_staging.hpp"
#include "work_device.hpp"

namespace dlop::backend::on_device {
namespace {

using CopyBack = std::vector<std::pair<at::Tensor, at::Tensor>>;

Tensors to_host(DeviceCall& call, const Tensors& tensors) {
  Tensors host;
  for (const auto& t : tensors) host.push_back(call.to_host(t));
  return host;
}

// Host tensors the host operation fills, each copied back to its device tensor.
Tensors outputs_of(DeviceCall& call, const Tensors& tensors, CopyBack& copy_back) {
  Tensors host;
  for (const auto& t : tensors) {
    host.push_back(call.host_like(t));
    copy_back.emplace_back(t, host.back());
  }
  return host;
}

TensorLists to_host(DeviceCall& call, const TensorLists& lists) {
  TensorLists host;
  for (const auto& list : lists) host.push_back(to_host(call, list));
  return host;
}

TensorLists outputs_of(DeviceCall& call, const TensorLists& lists, CopyBack& copy_back) {
  TensorLists host;
  for (const auto& list : lists) host.push_back(outputs_of(call, list, copy_back));
  return host;
}

// Inputs that are also outputs (in-place collectives).
Tensors in_out(DeviceCall& call, const Tensors& tensors, CopyBack& copy_back) {
  Tensors host = to_host(call, tensors);
  for (std::size_t i = 0; i < tensors.size(); ++i) copy_back.emplace_back(tensors[i], host[i]);
  return host;
}

bool premultiplies(const c10d::ReduceOp& op) { return op == c10d::ReduceOp::PREMUL_SUM; }

// Runs `host_call` as one host operation once the inputs staged so far have
// arrived: the engine waits for them, or, where the CPU implementation reads
// them at call time (packing lists, premultiplying), the host does first.
template <class HostCall>
WorkPtr one_step(ProcessGroupDlop& pg, c10d::OpType type, DeviceCall& call, Tensors outputs, CopyBack copy_back,
                 bool host_reads_inputs, HostCall&& host_call) {
  std::shared_ptr<const StreamEvent> ready;
  if (host_reads_inputs) {
    call.wait_on_host();
  } else {
    ready = call.staged();
  }
  WorkPtr host;
  {
    const DeviceScope scope(std::move(ready));
    host = host_call();
  }
  auto work = c10::make_intrusive<WorkDevice>(pg.getRank(), type, call, std::move(outputs));
  work->start({{std::move(host), std::move(copy_back)}});
  return work;
}

// An in-place operation on one contiguous tensor, in chunks of
// DLOP_DEVICE_CHUNK_BYTES: chunk i's copies overlap chunk i±1's host
// operation. `fill` says whether this rank's chunks need copying out (a
// broadcast's receivers need not).
template <class HostCall>
WorkPtr chunked(ProcessGroupDlop& pg, c10d::OpType type, DeviceCall& call, const at::Tensor& tensor, bool fill,
                HostCall&& host_call) {
  const auto host = call.host_like(tensor);
  const auto device_flat = tensor.view(-1);
  const auto host_flat = host.view(-1);
  const int64_t total = device_flat.numel();
  const auto element = static_cast<int64_t>(tensor.element_size());
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(config().device_chunk_bytes) / element);
  std::vector<WorkDevice::Step> steps;
  for (int64_t offset = 0; offset < total || (total == 0 && steps.empty()); offset += chunk) {
    const int64_t n = std::min(chunk, total - offset);
    auto device_part = device_flat.narrow(0, offset, n);
    auto host_part = host_flat.narrow(0, offset, n);
    if (fill && n != 0) {
      const c10::StreamGuard guard(call.streams().to_host);
      host_part.copy_(device_part, /*non_blocking=*/true);
    }
    Tensors one{host_part};
    const DeviceScope scope(call.staged());
    steps.push_back({host_call(one), {{device_part, host_part}}});
  }
  auto work = c10::make_intrusive<WorkDevice>(pg.getRank(), type, call, Tensors{tensor});
  work->start(std::move(steps));
  return work;
}

bool chunkable(const at::Tensor& t) { return t.is_contiguous() && t.layout() == at::kStrided; }

}  // namespace

WorkPtr allreduce(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, const c10d::AllreduceOptions& opts) {
  DeviceCall call(device);
  if (tensors.size() == 1 && chunkable(tensors[0]) && !premultiplies(opts.reduceOp)) {
    return chunked(pg, c10d::OpType::ALLREDUCE, call, tensors[0], true,
                   [&](Tensors& host) { return pg.allreduce(host, opts); });
  }
  CopyBack copy_back;
  auto host = in_out(call, tensors, copy_back);
  return one_step(pg, c10d::OpType::ALLREDUCE, call, tensors, std::move(copy_back), premultiplies(opts.reduceOp),
                  [&] { return pg.allreduce(host, opts); });
}

WorkPtr allreduce_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors,
                            const c10d::AllreduceCoalescedOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host = in_out(call, tensors, copy_back);
  return one_step(pg, c10d::OpType::ALLREDUCE_COALESCED, call, tensors, std::move(copy_back), true,
                  [&] { return pg.allreduce_coalesced(host, opts); });
}

WorkPtr broadcast(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, const c10d::BroadcastOptions& opts) {
  DeviceCall call(device);
  const bool root = opts.rootRank == pg.getRank();
  if (tensors.size() == 1 && chunkable(tensors[0])) {
    return chunked(pg, c10d::OpType::BROADCAST, call, tensors[0], root,
                   [&](Tensors& host) { return pg.broadcast(host, opts); });
  }
  CopyBack copy_back;
  auto host = in_out(call, tensors, copy_back);
  return one_step(pg, c10d::OpType::BROADCAST, call, tensors, std::move(copy_back), false,
                  [&] { return pg.broadcast(host, opts); });
}

WorkPtr reduce(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, const c10d::ReduceOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host = in_out(call, tensors, copy_back);
  return one_step(pg, c10d::OpType::REDUCE, call, tensors, std::move(copy_back), premultiplies(opts.reduceOp),
                  [&] { return pg.reduce(host, opts); });
}

WorkPtr allgather(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs, Tensors& inputs,
                  const c10d::AllgatherOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::ALLGATHER, call, flatten(outputs), std::move(copy_back), false,
                  [&] { return pg.allgather(host_out, host_in, opts); });
}

WorkPtr allgather_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output, at::Tensor& input,
                       const c10d::AllgatherOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = call.to_host(input);
  auto host_out = outputs_of(call, {output}, copy_back)[0];
  return one_step(pg, c10d::OpType::_ALLGATHER_BASE, call, {output}, std::move(copy_back), false,
                  [&] { return pg._allgather_base(host_out, host_in, opts); });
}

WorkPtr allgather_coalesced(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs, Tensors& inputs,
                            const c10d::AllgatherOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::ALLGATHER_COALESCED, call, flatten(outputs), std::move(copy_back), true,
                  [&] { return pg.allgather_coalesced(host_out, host_in, opts); });
}

WorkPtr allgather_into_tensor_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                                        const c10d::AllgatherOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::COALESCED, call, outputs, std::move(copy_back), false,
                  [&] { return pg.allgather_into_tensor_coalesced(host_out, host_in, opts); });
}

WorkPtr gather(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs, Tensors& inputs,
               const c10d::GatherOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::GATHER, call, flatten(outputs), std::move(copy_back), false,
                  [&] { return pg.gather(host_out, host_in, opts); });
}

WorkPtr scatter(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, TensorLists& inputs,
                const c10d::ScatterOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::SCATTER, call, outputs, std::move(copy_back), true,
                  [&] { return pg.scatter(host_out, host_in, opts); });
}

WorkPtr reduce_scatter(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, TensorLists& inputs,
                       const c10d::ReduceScatterOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::REDUCE_SCATTER, call, outputs, std::move(copy_back), true,
                  [&] { return pg.reduce_scatter(host_out, host_in, opts); });
}

WorkPtr reduce_scatter_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output, at::Tensor& input,
                            const c10d::ReduceScatterOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = call.to_host(input);
  auto host_out = outputs_of(call, {output}, copy_back)[0];
  return one_step(pg, c10d::OpType::_REDUCE_SCATTER_BASE, call, {output}, std::move(copy_back),
                  premultiplies(opts.reduceOp), [&] { return pg._reduce_scatter_base(host_out, host_in, opts); });
}

WorkPtr reduce_scatter_tensor_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                                        const c10d::ReduceScatterOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::COALESCED, call, outputs, std::move(copy_back), premultiplies(opts.reduceOp),
                  [&] { return pg.reduce_scatter_tensor_coalesced(host_out, host_in, opts); });
}

WorkPtr alltoall_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output, at::Tensor& input,
                      std::vector<int64_t>& output_split_sizes, std::vector<int64_t>& input_split_sizes,
                      const c10d::AllToAllOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = call.to_host(input);
  auto host_out = outputs_of(call, {output}, copy_back)[0];
  return one_step(pg, c10d::OpType::ALLTOALL_BASE, call, {output}, std::move(copy_back), false, [&] {
    return pg.alltoall_base(host_out, host_in, output_split_sizes, input_split_sizes, opts);
  });
}

WorkPtr alltoall(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                 const c10d::AllToAllOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::ALLTOALL, call, outputs, std::move(copy_back), true,
                  [&] { return pg.alltoall(host_out, host_in, opts); });
}

WorkPtr send(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, int dst_rank, int tag) {
  DeviceCall call(device);
  auto host = to_host(call, tensors);
  return one_step(pg, c10d::OpType::SEND, call, {}, {}, false, [&] { return pg.send(host, dst_rank, tag); });
}

WorkPtr recv(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, int src_rank, int tag) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host = outputs_of(call, tensors, copy_back);
  return one_step(pg, c10d::OpType::RECV, call, tensors, std::move(copy_back), false,
                  [&] { return pg.recv(host, src_rank, tag); });
}

WorkPtr recv_anysource(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, int tag) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host = outputs_of(call, tensors, copy_back);
  return one_step(pg, c10d::OpType::RECVANYSOURCE, call, tensors, std::move(copy_back), false,
                  [&] { return pg.recvAnysource(host, tag); });
}

}  // namespace dlop::backend::on_device
