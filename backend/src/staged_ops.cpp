#include "staged_ops.hpp"

#include <c10/core/StreamGuard.h>

#include <algorithm>

#include "backend/process_group_dlop.hpp"
#include "backend/torch_error.hpp"
#include "core/config.hpp"
#include "device_staging.hpp"
#include "shared_device.hpp"
#include "tensor_args.hpp"
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

TensorLists outputs_of(DeviceCall& call, const TensorLists& lists, CopyBack& copy_back) {
  TensorLists host;
  for (const auto& list : lists) host.push_back(outputs_of(call, list, copy_back));
  return host;
}

// In-place collectives: `sources` copied out, the results copied back into
// `tensors` (the same, or their premultiplied copies).
Tensors in_out(DeviceCall& call, const Tensors& sources, const Tensors& tensors, CopyBack& copy_back) {
  Tensors host = to_host(call, sources);
  for (std::size_t i = 0; i < tensors.size(); ++i) copy_back.emplace_back(tensors[i], host[i]);
  return host;
}

// No host code may read a staged input at call time: its copy may not have
// arrived, and waiting for it would drain the device's queue on the caller's
// thread. So a PREMUL_SUM multiplies on the device, on the copy-out stream
// (the host then sums), and lists are copied out one after another into one
// buffer (the host operation then reads them as one, without packing).
c10d::ReduceOp summed(const c10d::ReduceOp& op) {
  return op == c10d::ReduceOp::PREMUL_SUM ? c10d::ReduceOp(c10d::ReduceOp::SUM) : op;
}

Tensors premultiplied(DeviceCall& call, const Tensors& tensors, const c10d::ReduceOp& op) {
  if (op != c10d::ReduceOp::PREMUL_SUM) return tensors;
  const c10::StreamGuard guard(call.streams().to_host);
  Tensors out;
  for (const auto& t : tensors) {
    out.push_back(t * *premul_factor(op, t));
    call.buffers()->tensors.push_back(out.back());
  }
  return out;
}

// Pinned host tensors shaped as `like`, one after another in one buffer,
// each starting at a multiple of `align` bytes; `bytes` spans them all.
struct Packed {
  at::Tensor bytes;
  Tensors parts;
};
Packed packed_like(DeviceCall& call, const Tensors& like, std::size_t align = 1) {
  const auto round_up = [&](std::size_t n) { return (n + align - 1) / align * align; };
  std::size_t total = 0;
  for (const auto& t : like) total = round_up(total) + t.nbytes();
  Packed packed{call.host_bytes(round_up(total)), {}};
  std::size_t offset = 0;
  for (const auto& t : like) {
    offset = round_up(offset);
    packed.parts.push_back(packed.bytes.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(t.nbytes()))
                               .view(t.scalar_type())
                               .view(t.sizes()));
    offset += t.nbytes();
  }
  return packed;
}

void copy_out(DeviceCall& call, const Tensors& device, const Tensors& host) {
  const c10::StreamGuard guard(call.streams().to_host);
  for (std::size_t i = 0; i < device.size(); ++i) {
    call.buffers()->tensors.push_back(device[i]);
    if (device[i].numel() != 0) host[i].copy_(device[i], /*non_blocking=*/true);
  }
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

// A tensor goes in at least kPipelineDepth chunks where they can be
// kSmallestChunk or more, and none over DLOP_DEVICE_CHUNK_BYTES: the copies
// of the last chunk of a step's last bucket are the part that no backward
// pass can hide, and a 1 MiB bucket in one chunk made them the whole bucket
// (DDP overlap 0.73 on dlop_test at 0.1 GB/s, 0.82 in chunks of 256 KiB).
constexpr std::size_t kPipelineDepth = 4;
constexpr std::size_t kSmallestChunk = std::size_t{256} << 10;

std::size_t chunk_bytes(std::size_t bytes) {
  return std::min(config().device_chunk_bytes, std::max(kSmallestChunk, bytes / kPipelineDepth));
}

// An in-place operation on one contiguous tensor, in chunks of chunk_bytes(): chunk i's copies overlap chunk i±1's host
// operation. `source` (the tensor, or its premultiplied copy) is copied out
// where `fill` says this rank's chunks need it (a broadcast's receivers do
// not); the results go back into `tensor`.
template <class HostCall>
WorkPtr chunked(ProcessGroupDlop& pg, c10d::OpType type, DeviceCall& call, const at::Tensor& source,
                const at::Tensor& tensor, bool fill, HostCall&& host_call) {
  const auto host = call.host_like(tensor);
  const auto source_flat = source.view(-1);
  const auto device_flat = tensor.view(-1);
  const auto host_flat = host.view(-1);
  const int64_t total = device_flat.numel();
  const auto element = static_cast<int64_t>(tensor.element_size());
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes(tensor.nbytes())) / element);
  std::vector<WorkDevice::Step> steps;
  for (int64_t offset = 0; offset < total || (total == 0 && steps.empty()); offset += chunk) {
    const int64_t n = std::min(chunk, total - offset);
    auto device_part = device_flat.narrow(0, offset, n);
    auto host_part = host_flat.narrow(0, offset, n);
    if (fill && n != 0) {
      const c10::StreamGuard guard(call.streams().to_host);
      host_part.copy_(source_flat.narrow(0, offset, n), /*non_blocking=*/true);
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
  if (auto arena = pg.shared_device(device); arena && arena->serves(tensors, opts.reduceOp)) {
    return arena->allreduce(pg, tensors[0], opts);
  }
  DeviceCall call(device);
  const auto sources = premultiplied(call, tensors, opts.reduceOp);
  auto host_opts = opts;
  host_opts.reduceOp = summed(opts.reduceOp);
  if (tensors.size() == 1 && chunkable(tensors[0])) {
    return chunked(pg, c10d::OpType::ALLREDUCE, call, sources[0], tensors[0], true,
                   [&](Tensors& host) { return pg.allreduce(host, host_opts); });
  }
  CopyBack copy_back;
  auto host = in_out(call, sources, tensors, copy_back);
  return one_step(pg, c10d::OpType::ALLREDUCE, call, tensors, std::move(copy_back),
                  [&] { return pg.allreduce(host, host_opts); });
}

// One all-reduce of the tensors copied out one after another.
WorkPtr allreduce_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors,
                            const c10d::AllreduceCoalescedOptions& opts) {
  for (const auto& t : tensors) {
    DLOP_CHECK_ARG(t.scalar_type() == tensors[0].scalar_type(), "dlop allreduce_coalesced: tensors of dtypes ",
                   tensors[0].scalar_type(), " and ", t.scalar_type(), " (one dtype per call)");
  }
  DeviceCall call(device);
  const auto sources = premultiplied(call, tensors, opts.reduceOp);
  auto packed = packed_like(call, tensors);
  copy_out(call, sources, packed.parts);
  CopyBack copy_back;
  for (std::size_t i = 0; i < tensors.size(); ++i) copy_back.emplace_back(tensors[i], packed.parts[i]);
  c10d::AllreduceOptions host_opts;
  host_opts.reduceOp = summed(opts.reduceOp);
  host_opts.timeout = opts.timeout;
  Tensors flat{tensors.empty() ? packed.bytes : packed.bytes.view(tensors[0].scalar_type())};
  return one_step(pg, c10d::OpType::ALLREDUCE_COALESCED, call, tensors, std::move(copy_back),
                  [&] { return pg.allreduce(flat, host_opts); });
}

WorkPtr broadcast(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, const c10d::BroadcastOptions& opts) {
  DeviceCall call(device);
  const bool root = opts.rootRank == pg.getRank();
  if (tensors.size() == 1 && chunkable(tensors[0])) {
    return chunked(pg, c10d::OpType::BROADCAST, call, tensors[0], tensors[0], root,
                   [&](Tensors& host) { return pg.broadcast(host, opts); });
  }
  CopyBack copy_back;
  auto host = in_out(call, tensors, tensors, copy_back);
  return one_step(pg, c10d::OpType::BROADCAST, call, tensors, std::move(copy_back),
                  [&] { return pg.broadcast(host, opts); });
}

WorkPtr reduce(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, const c10d::ReduceOptions& opts) {
  DeviceCall call(device);
  const auto sources = premultiplied(call, tensors, opts.reduceOp);
  auto host_opts = opts;
  host_opts.reduceOp = summed(opts.reduceOp);
  CopyBack copy_back;
  auto host = in_out(call, sources, tensors, copy_back);
  return one_step(pg, c10d::OpType::REDUCE, call, tensors, std::move(copy_back),
                  [&] { return pg.reduce(host, host_opts); });
}
WorkPtr allgather(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs, Tensors& inputs,
                  const c10d::AllgatherOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::ALLGATHER, call, flatten(outputs), std::move(copy_back),
                  [&] { return pg.allgather(host_out, host_in, opts); });
}

WorkPtr allgather_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output, at::Tensor& input,
                       const c10d::AllgatherOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = call.to_host(input);
  auto host_out = outputs_of(call, {output}, copy_back)[0];
  return one_step(pg, c10d::OpType::_ALLGATHER_BASE, call, {output}, std::move(copy_back),
                  [&] { return pg._allgather_base(host_out, host_in, opts); });
}

// outputs[r][i] receives rank r's inputs[i]: the inputs are copied out into
// one buffer, each at a 16-byte boundary (their dtypes may differ), and one
// all-gather of those bytes fills every rank's copy at the same offsets.
WorkPtr allgather_coalesced(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs, Tensors& inputs,
                            const c10d::AllgatherOptions& opts) {
  DLOP_CHECK_ARG(outputs.size() == static_cast<std::size_t>(pg.getSize()), "dlop allgather_coalesced: expects ",
                 pg.getSize(), " output lists, got ", outputs.size());
  for (const auto& list : outputs) {
    DLOP_CHECK_ARG(list.size() == inputs.size(), "dlop allgather_coalesced: output list of ", list.size(),
                   " tensors for ", inputs.size(), " inputs");
    for (std::size_t i = 0; i < list.size(); ++i) {
      DLOP_CHECK_ARG(list[i].scalar_type() == inputs[i].scalar_type() && list[i].numel() == inputs[i].numel(),
                     "dlop allgather_coalesced: output ", i, " (", list[i].scalar_type(), ", ", list[i].numel(),
                     " elements) does not match input ", i, " (", inputs[i].scalar_type(), ", ", inputs[i].numel(),
                     " elements)");
    }
  }
  constexpr std::size_t kAlign = 16;
  DeviceCall call(device);
  auto in = packed_like(call, inputs, kAlign);
  copy_out(call, inputs, in.parts);
  Tensors every_rank_like;
  for (const auto& list : outputs) every_rank_like.insert(every_rank_like.end(), list.begin(), list.end());
  auto out = packed_like(call, every_rank_like, kAlign);
  CopyBack copy_back;
  for (std::size_t i = 0; i < every_rank_like.size(); ++i) copy_back.emplace_back(every_rank_like[i], out.parts[i]);
  return one_step(pg, c10d::OpType::ALLGATHER_COALESCED, call, every_rank_like, std::move(copy_back),
                  [&] { return pg._allgather_base(out.bytes, in.bytes, opts); });
}

WorkPtr allgather_into_tensor_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                                        const c10d::AllgatherOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::COALESCED, call, outputs, std::move(copy_back),
                  [&] { return pg.allgather_into_tensor_coalesced(host_out, host_in, opts); });
}

WorkPtr gather(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs, Tensors& inputs,
               const c10d::GatherOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, inputs);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::GATHER, call, flatten(outputs), std::move(copy_back),
                  [&] { return pg.gather(host_out, host_in, opts); });
}

WorkPtr scatter(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, TensorLists& inputs,
                const c10d::ScatterOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  TensorLists host_in;
  for (const auto& list : inputs) {
    host_in.push_back(packed_like(call, list).parts);
    copy_out(call, list, host_in.back());
  }
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::SCATTER, call, outputs, std::move(copy_back),
                  [&] { return pg.scatter(host_out, host_in, opts); });
}

WorkPtr reduce_scatter(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, TensorLists& inputs,
                       const c10d::ReduceScatterOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  TensorLists host_in;
  for (const auto& list : inputs) {
    host_in.push_back(packed_like(call, list).parts);
    copy_out(call, premultiplied(call, list, opts.reduceOp), host_in.back());
  }
  auto host_opts = opts;
  host_opts.reduceOp = summed(opts.reduceOp);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::REDUCE_SCATTER, call, outputs, std::move(copy_back),
                  [&] { return pg.reduce_scatter(host_out, host_in, host_opts); });
}

WorkPtr reduce_scatter_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output, at::Tensor& input,
                            const c10d::ReduceScatterOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = call.to_host(premultiplied(call, {input}, opts.reduceOp)[0]);
  auto host_opts = opts;
  host_opts.reduceOp = summed(opts.reduceOp);
  auto host_out = outputs_of(call, {output}, copy_back)[0];
  return one_step(pg, c10d::OpType::_REDUCE_SCATTER_BASE, call, {output}, std::move(copy_back),
                  [&] { return pg._reduce_scatter_base(host_out, host_in, host_opts); });
}

WorkPtr reduce_scatter_tensor_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                                        const c10d::ReduceScatterOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = to_host(call, premultiplied(call, inputs, opts.reduceOp));
  auto host_opts = opts;
  host_opts.reduceOp = summed(opts.reduceOp);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::COALESCED, call, outputs, std::move(copy_back),
                  [&] { return pg.reduce_scatter_tensor_coalesced(host_out, host_in, host_opts); });
}

WorkPtr alltoall_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output, at::Tensor& input,
                      std::vector<int64_t>& output_split_sizes, std::vector<int64_t>& input_split_sizes,
                      const c10d::AllToAllOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = call.to_host(input);
  auto host_out = outputs_of(call, {output}, copy_back)[0];
  return one_step(pg, c10d::OpType::ALLTOALL_BASE, call, {output}, std::move(copy_back), [&] {
    return pg.alltoall_base(host_out, host_in, output_split_sizes, input_split_sizes, opts);
  });
}

WorkPtr alltoall(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                 const c10d::AllToAllOptions& opts) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host_in = packed_like(call, inputs).parts;
  copy_out(call, inputs, host_in);
  auto host_out = outputs_of(call, outputs, copy_back);
  return one_step(pg, c10d::OpType::ALLTOALL, call, outputs, std::move(copy_back),
                  [&] { return pg.alltoall(host_out, host_in, opts); });
}

WorkPtr send(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, int dst_rank, int tag) {
  DeviceCall call(device);
  auto host = to_host(call, tensors);
  return one_step(pg, c10d::OpType::SEND, call, {}, {}, [&] { return pg.send(host, dst_rank, tag); });
}

WorkPtr recv(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, int src_rank, int tag) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host = outputs_of(call, tensors, copy_back);
  return one_step(pg, c10d::OpType::RECV, call, tensors, std::move(copy_back),
                  [&] { return pg.recv(host, src_rank, tag); });
}

WorkPtr recv_anysource(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, int tag) {
  DeviceCall call(device);
  CopyBack copy_back;
  auto host = outputs_of(call, tensors, copy_back);
  return one_step(pg, c10d::OpType::RECVANYSOURCE, call, tensors, std::move(copy_back),
                  [&] { return pg.recvAnysource(host, tag); });
}

}  // namespace dlop::backend::on_device
