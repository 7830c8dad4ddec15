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

// An in-place collective on `tensors` as one host operation, `host_call`:
// `sources` (the tensors, or their premultiplied copies) copied out, the
// results copied back into `tensors`.
template <class HostCall>
WorkPtr in_place(ProcessGroupDlop& pg, c10d::OpType type, DeviceCall& call, const Tensors& sources,
                 const Tensors& tensors, HostCall&& host_call) {
  CopyBack copy_back;
  Tensors host = to_host(call, sources);
  for (std::size_t i = 0; i < tensors.size(); ++i) copy_back.emplace_back(tensors[i], host[i]);
  return one_step(pg, type, call, tensors, std::move(copy_back), [&] { return host_call(host); });
}

// No host code may read a staged input at call time: its copy may not have
// arrived, and waiting for it would drain the device's queue on the caller's
// thread. So a PREMUL_SUM multiplies on the device, on the copy-out stream
// (the host then sums), and lists are copied out one after another into one
// buffer (the host operation then reads them as one, without packing).
c10d::ReduceOp summed(const c10d::ReduceOp& op) {
  return op == c10d::ReduceOp::PREMUL_SUM ? c10d::ReduceOp(c10d::ReduceOp::SUM) : op;
}

// The options of the host half of a reduction: it sums what the device premultiplied.
template <class Options>
Options host_options(const Options& opts) {
  auto host = opts;
  host.reduceOp = summed(opts.reduceOp);
  return host;
}

at::Tensor premultiplied(DeviceCall& call, const at::Tensor& tensor, const c10d::ReduceOp& op) {
  if (op != c10d::ReduceOp::PREMUL_SUM) return tensor;
  const c10::StreamGuard guard(call.streams().to_host);
  auto out = tensor * *premul_factor(op, tensor);
  call.buffers()->tensors.push_back(out);
  return out;
}
Tensors premultiplied(DeviceCall& call, const Tensors& tensors, const c10d::ReduceOp& op) {
  Tensors out;
  for (const auto& t : tensors) out.push_back(premultiplied(call, t, op));
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

// Host copies of `tensors` one after another in one buffer, premultiplied on
// the device first where `op` is a PREMUL_SUM.
Tensors packed_copies(DeviceCall& call, const Tensors& tensors,
                      const c10d::ReduceOp& op = c10d::ReduceOp(c10d::ReduceOp::SUM)) {
  auto host = packed_like(call, tensors).parts;
  copy_out(call, premultiplied(call, tensors, op), host);
  return host;
}

// A reduction whose inputs are premultiplied on the device (a tensor or a
// list, as `op` takes them) and summed on the host.
template <class T, class Op>
WorkPtr summed_on_host(ProcessGroupDlop& pg, c10::Device device, c10d::OpType type, const T& outputs,
                       const T& inputs, const c10d::ReduceOp& reduce, Op&& op) {
  DeviceCall call(device);
  return staged_call(pg, call, type, outputs, to_host(call, premultiplied(call, inputs, reduce)), op);
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

WorkPtr Staged::allreduce(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors,
                          const c10d::AllreduceOptions& opts) {
  if (auto arena = pg.shared_device(device); arena && arena->serves(tensors, opts.reduceOp)) {
    return arena->allreduce(pg, tensors[0], opts);
  }
  DeviceCall call(device);
  const auto sources = premultiplied(call, tensors, opts.reduceOp);
  const auto host_opts = host_options(opts);
  const auto host_call = [&](Tensors& host) { return pg.host_allreduce(host, host_opts); };
  if (tensors.size() == 1 && chunkable(tensors[0])) {
    return chunked(pg, c10d::OpType::ALLREDUCE, call, sources[0], tensors[0], true, host_call);
  }
  return in_place(pg, c10d::OpType::ALLREDUCE, call, sources, tensors, host_call);
}

// One all-reduce of the tensors copied out one after another.
WorkPtr Staged::allreduce_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors,
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
                  [&] { return pg.host_allreduce(flat, host_opts); });
}

WorkPtr Staged::broadcast(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors,
                          const c10d::BroadcastOptions& opts) {
  DeviceCall call(device);
  const bool root = opts.rootRank == pg.getRank();
  const auto host_call = [&](Tensors& host) { return pg.host_broadcast(host, opts); };
  if (tensors.size() == 1 && chunkable(tensors[0])) {
    return chunked(pg, c10d::OpType::BROADCAST, call, tensors[0], tensors[0], root, host_call);
  }
  return in_place(pg, c10d::OpType::BROADCAST, call, tensors, tensors, host_call);
}

WorkPtr Staged::reduce(ProcessGroupDlop& pg, c10::Device device, Tensors& tensors, const c10d::ReduceOptions& opts) {
  DeviceCall call(device);
  const auto sources = premultiplied(call, tensors, opts.reduceOp);
  const auto host_opts = host_options(opts);
  return in_place(pg, c10d::OpType::REDUCE, call, sources, tensors,
                  [&](Tensors& host) { return pg.host_reduce(host, host_opts); });
}

// outputs[r][i] receives rank r's inputs[i]: the inputs are copied out into
// one buffer, each at a 16-byte boundary (their dtypes may differ), and one
// all-gather of those bytes fills every rank's copy at the same offsets.
WorkPtr Staged::allgather_coalesced(ProcessGroupDlop& pg, c10::Device device, TensorLists& outputs, Tensors& inputs,
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
                  [&] { return pg.host_allgather_base(out.bytes, in.bytes, opts); });
}

WorkPtr Staged::scatter(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, TensorLists& inputs,
                        const c10d::ScatterOptions& opts) {
  DeviceCall call(device);
  TensorLists host_in;
  for (const auto& list : inputs) host_in.push_back(packed_copies(call, list));
  return staged_call(pg, call, c10d::OpType::SCATTER, outputs, std::move(host_in),
                     [&](Tensors& out, TensorLists& in) { return pg.host_scatter(out, in, opts); });
}

WorkPtr Staged::reduce_scatter(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, TensorLists& inputs,
                               const c10d::ReduceScatterOptions& opts) {
  DeviceCall call(device);
  TensorLists host_in;
  for (const auto& list : inputs) host_in.push_back(packed_copies(call, list, opts.reduceOp));
  const auto host_opts = host_options(opts);
  return staged_call(pg, call, c10d::OpType::REDUCE_SCATTER, outputs, std::move(host_in),
                     [&](Tensors& out, TensorLists& in) { return pg.host_reduce_scatter(out, in, host_opts); });
}

WorkPtr Staged::reduce_scatter_base(ProcessGroupDlop& pg, c10::Device device, at::Tensor& output, at::Tensor& input,
                                    const c10d::ReduceScatterOptions& opts) {
  const auto host_opts = host_options(opts);
  return summed_on_host(pg, device, c10d::OpType::_REDUCE_SCATTER_BASE, output, input, opts.reduceOp,
                        [&](at::Tensor& out, at::Tensor& in) {
                          return pg.host_reduce_scatter_base(out, in, host_opts);
                        });
}

WorkPtr Staged::reduce_scatter_tensor_coalesced(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs,
                                                Tensors& inputs, const c10d::ReduceScatterOptions& opts) {
  const auto host_opts = host_options(opts);
  return summed_on_host(pg, device, c10d::OpType::COALESCED, outputs, inputs, opts.reduceOp,
                        [&](Tensors& out, Tensors& in) {
                          return pg.host_reduce_scatter_tensor_coalesced(out, in, host_opts);
                        });
}

WorkPtr Staged::alltoall(ProcessGroupDlop& pg, c10::Device device, Tensors& outputs, Tensors& inputs,
                         const c10d::AllToAllOptions& opts) {
  DeviceCall call(device);
  auto host_in = packed_copies(call, inputs);
  return staged_call(pg, call, c10d::OpType::ALLTOALL, outputs, std::move(host_in),
                     [&](Tensors& out, Tensors& in) { return pg.host_alltoall(out, in, opts); });
}

}  // namespace dlop::backend::on_device
