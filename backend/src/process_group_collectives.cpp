// ProcessGroupDlop's collectives: each checks its tensors, stages what is not
// contiguous (or has to be packed, like a list of outputs) and submits to the
// engine; the Work copies staged results back before completing its future.
#include <ATen/ATen.h>

#include <cstring>
#include <numeric>
#include <optional>

#include "backend/process_group_dlop.hpp"
#include "backend/torch_error.hpp"
#include "device_staging.hpp"
#include "sparse_allreduce.hpp"
#include "staged_ops.hpp"
#include "tensor_args.hpp"
#include "backend/work_dlop.hpp"

namespace dlop::backend {
namespace {

using c10d::OpType;
using coll::DataType;

// The copy-back step of a tensor staged by staged(), and what the Work keeps
// alive for it: nothing when the operation ran on the tensor itself (the
// usual case, where a closure would cost an allocation per call).
std::function<void()> copy_back_step(const at::Tensor& user, const at::Tensor& stage) {
  if (user.is_same(stage)) return nullptr;
  return [user, stage] { copy_back(user, stage); };
}
std::vector<at::Tensor> kept_stage(const at::Tensor& user, const at::Tensor& stage) {
  return user.is_same(stage) ? std::vector<at::Tensor>{} : std::vector<at::Tensor>{stage};
}

// The tensors' bytes as one buffer, without a copy, where they already lie
// one after another in one storage (a staged call's host copies do): nothing
// then reads them at call time, when a device may still be filling them.
std::optional<at::Tensor> consecutive_bytes(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return std::nullopt;
  const auto* expected = static_cast<const std::uint8_t*>(tensors[0].data_ptr());
  std::size_t total = 0;
  for (const auto& t : tensors) {
    const bool in_place = t.is_contiguous() && t.storage().is_alias_of(tensors[0].storage()) &&
                          (t.nbytes() == 0 || static_cast<const std::uint8_t*>(t.data_ptr()) == expected);
    if (!in_place) return std::nullopt;
    expected += t.nbytes();
    total += t.nbytes();
  }
  const auto& first = tensors[0];
  auto bytes = at::empty({0}, first.options().dtype(at::kByte));
  bytes.set_(first.storage(), static_cast<int64_t>(first.storage_offset()) * first.element_size(),
             {static_cast<int64_t>(total)}, {1});
  return bytes;
}

// The tensors as one contiguous byte buffer, in order. Copies raw bytes: the
// tensors may differ in dtype (allgather_coalesced), and a tensor of 0 or 1
// elements counts as contiguous whatever its stride, which view(kByte) refuses.
at::Tensor pack_bytes(const std::vector<at::Tensor>& tensors) {
  if (auto bytes = consecutive_bytes(tensors)) return *bytes;
  std::size_t total = 0;
  for (const auto& t : tensors) total += t.nbytes();
  auto flat = at::empty({static_cast<int64_t>(total)}, at::kByte);
  auto* out = static_cast<std::uint8_t*>(flat.data_ptr());
  for (const auto& t : tensors) {
    const auto c = t.contiguous();
    if (c.nbytes() != 0) std::memcpy(out, c.data_ptr(), c.nbytes());
    out += c.nbytes();
  }
  return flat;
}

// Copies consecutive pieces of `flat` (bytes) into the tensors, in order,
// starting at byte `offset`; returns the offset after the last one. The
// pieces need not be aligned for the tensors' dtypes.
std::size_t unpack_bytes(const at::Tensor& flat, std::size_t offset, const std::vector<at::Tensor>& tensors) {
  const auto* in = static_cast<const std::uint8_t*>(flat.data_ptr());
  for (const auto& t : tensors) {
    const auto n = t.nbytes();
    if (n != 0) {
      if (t.is_contiguous()) {
        std::memcpy(t.data_ptr(), in + offset, n);
      } else {
        auto tmp = at::empty(t.sizes(), t.options());
        std::memcpy(tmp.data_ptr(), in + offset, n);
        t.copy_(tmp);
      }
    }
    offset += n;
  }
  return offset;
}

void check_list(const std::vector<at::Tensor>& list, std::size_t size, const at::Tensor& like, bool same_numel,
                std::string_view op) {
  DLOP_CHECK_ARG(list.size() == size, "dlop ", op, ": expects a list of ", size, " tensors, got ", list.size());
  for (const auto& t : list) {
    check_tensor(t, op);
    check_same_dtype(t, like, op);
    DLOP_CHECK_ARG(!same_numel || t.numel() == like.numel(), "dlop ", op, ": tensor of ", t.numel(),
                      " elements where ", like.numel(), " were expected");
  }
}

std::vector<std::size_t> byte_counts(const std::vector<at::Tensor>& list) {
  std::vector<std::size_t> counts;
  for (const auto& t : list) counts.push_back(t.nbytes());
  return counts;
}

bool all_equal(const std::vector<std::size_t>& counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  const auto device = call_device(tensors, "allreduce");
  if (auto work = delegated(device, "allreduce", [&](c10d::Backend& d) { return d.allreduce(tensors, opts); })) return *work;
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse) {
    auto gathers = start_sparse_allreduce(*comm_, tensors[0], opts, op_options(opts.timeout));
    return make_work(OpType::ALLREDUCE, std::move(gathers.handles), {tensors[0]}, std::move(gathers.keep_alive),
                     std::move(gathers.finish));
  }
  if (!device.is_cpu()) return on_device::allreduce(*this, device, tensors, opts);
  const auto& tensor = single_tensor(tensors, "allreduce");
  const auto op = engine_op(opts.reduceOp, "allreduce");
  auto stage = staged(tensor);
  if (auto factor = premul_factor(opts.reduceOp, stage)) stage.mul_(*factor);
  const auto view = reduce_view(stage, opts.reduceOp, "allreduce");
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto handle = torch_errors([&] { return comm_->allreduce(view.data, view.data, view.count, view.dtype, op, options); });
  return make_work(OpType::ALLREDUCE, {std::move(handle)}, {tensor}, kept_stage(tensor, stage),
                   copy_back_step(tensor, stage), options.caller_waits);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  const auto device = call_device({&tensors}, "allreduce_coalesced");
  if (auto work = delegated(device, "allreduce_coalesced", [&](c10d::Backend& d) { return d.allreduce_coalesced(tensors, opts); })) return *work;
  if (!device.is_cpu()) return on_device::allreduce_coalesced(*this, device, tensors, opts);
  DLOP_CHECK_ARG(!tensors.empty(), "dlop allreduce_coalesced: no tensors");
  for (const auto& t : tensors) {
    check_tensor(t, "allreduce_coalesced");
    check_same_dtype(t, tensors[0], "allreduce_coalesced");
  }
  const auto op = engine_op(opts.reduceOp, "allreduce_coalesced");
  std::vector<at::Tensor> flat_parts;
  for (const auto& t : tensors) flat_parts.push_back(t.reshape(-1));
  auto flat = at::cat(flat_parts);
  if (auto factor = premul_factor(opts.reduceOp, flat)) flat.mul_(*factor);
  const auto view = reduce_view(flat, opts.reduceOp, "allreduce_coalesced");
  auto handle = torch_errors(
      [&] { return comm_->allreduce(view.data, view.data, view.count, view.dtype, op, op_options(opts.timeout)); });
  return make_work(OpType::ALLREDUCE_COALESCED, {std::move(handle)}, tensors, {flat}, [tensors, flat] {
    unpack_bytes(flat, 0, tensors);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  const auto device = call_device({&tensors}, "broadcast");
  if (auto work = delegated(device, "broadcast", [&](c10d::Backend& d) { return d.broadcast(tensors, opts); })) return *work;
  if (!device.is_cpu()) return on_device::broadcast(*this, device, tensors, opts);
  const auto& tensor = single_tensor(tensors, "broadcast");
  check_root(opts.rootRank, "broadcast");
  DLOP_CHECK_ARG(opts.rootTensor == 0, "dlop broadcast: invalid root tensor ", opts.rootTensor);
  auto stage = staged(tensor);
  const auto view = byte_view(stage);
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto handle = torch_errors([&] {
    return comm_->broadcast(view.data, view.count, view.dtype, static_cast<int>(opts.rootRank), options);
  });
  return make_work(OpType::BROADCAST, {std::move(handle)}, {tensor}, kept_stage(tensor, stage),
                   copy_back_step(tensor, stage), options.caller_waits);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  const auto device = call_device({&tensors}, "reduce");
  if (auto work = delegated(device, "reduce", [&](c10d::Backend& d) { return d.reduce(tensors, opts); })) return *work;
  if (!device.is_cpu()) return on_device::reduce(*this, device, tensors, opts);
  const auto& tensor = single_tensor(tensors, "reduce");
  check_root(opts.rootRank, "reduce");
  DLOP_CHECK_ARG(opts.rootTensor == 0, "dlop reduce: invalid root tensor ", opts.rootTensor);
  const auto op = engine_op(opts.reduceOp, "reduce");
  auto stage = staged(tensor);
  if (auto factor = premul_factor(opts.reduceOp, stage)) stage.mul_(*factor);
  const auto view = reduce_view(stage, opts.reduceOp, "reduce");
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto handle = torch_errors([&] {
    return comm_->reduce(view.data, view.data, view.count, view.dtype, op, static_cast<int>(opts.rootRank), options);
  });
  return make_work(OpType::REDUCE, {std::move(handle)}, {tensor}, kept_stage(tensor, stage),
                   copy_back_step(tensor, stage), options.caller_waits);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) {
  const auto output_list = flatten(outputs);
  const auto device = call_device({&inputs, &output_list}, "allgather");
  if (auto work = delegated(device, "allgather", [&](c10d::Backend& d) { return d.allgather(outputs, inputs, opts); })) return *work;
  if (!device.is_cpu()) return on_device::allgather(*this, device, outputs, inputs, opts);
  const auto& input = single_tensor(inputs, "allgather");
  DLOP_CHECK_ARG(outputs.size() == 1, "dlop allgather: expects one output list, got ", outputs.size());
  const auto& list = outputs[0];
  check_list(list, static_cast<std::size_t>(getSize()), input, false, "allgather");
  const auto counts = byte_counts(list);
  DLOP_CHECK_ARG(counts[static_cast<std::size_t>(getRank())] == input.nbytes(), "dlop allgather: this rank's output ",
                    "tensor has ", list[static_cast<std::size_t>(getRank())].numel(), " elements, its input ",
                    input.numel());
  auto in = input.contiguous();
  auto flat = at::empty({static_cast<int64_t>(std::accumulate(counts.begin(), counts.end(), std::size_t{0}))}, at::kByte);
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto handle = torch_errors([&] {
    return all_equal(counts) ? comm_->allgather(in.data_ptr(), flat.data_ptr(), in.nbytes(), DataType::kUInt8, options)
                             : comm_->allgatherv(in.data_ptr(), flat.data_ptr(), counts, DataType::kUInt8, options);
  });
  return make_work(OpType::ALLGATHER, {std::move(handle)}, list, {in, flat}, [list, flat] { unpack_bytes(flat, 0, list); },
                   options.caller_waits);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions& opts) {
  const std::vector<at::Tensor> both{input, output};
  const auto device = call_device({&both}, "all_gather_into_tensor");
  if (auto work = delegated(device, "all_gather_into_tensor", [&](c10d::Backend& d) { return d._allgather_base(output, input, opts); })) return *work;
  if (!device.is_cpu()) return on_device::allgather_base(*this, device, output, input, opts);
  check_tensor(input, "all_gather_into_tensor");
  check_tensor(output, "all_gather_into_tensor");
  check_same_dtype(input, output, "all_gather_into_tensor");
  DLOP_CHECK_ARG(output.numel() == input.numel() * getSize(), "dlop all_gather_into_tensor: output has ",
                    output.numel(), " elements, expected ", input.numel(), " x ", getSize());
  auto in = input.contiguous();
  auto out = staged(output);
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto handle = torch_errors(
      [&] { return comm_->allgather(in.data_ptr(), out.data_ptr(), in.nbytes(), DataType::kUInt8, options); });
  return make_work(OpType::_ALLGATHER_BASE, {std::move(handle)}, {output}, {in, out}, copy_back_step(output, out),
                   options.caller_waits);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                     std::vector<at::Tensor>& inputs,
                                                                     const c10d::AllgatherOptions& opts) {
  const auto output_list = flatten(outputs);
  const auto device = call_device({&inputs, &output_list}, "allgather_coalesced");
  if (auto work = delegated(device, "allgather_coalesced", [&](c10d::Backend& d) { return d.allgather_coalesced(outputs, inputs, opts); })) return *work;
  if (!device.is_cpu()) return on_device::allgather_coalesced(*this, device, outputs, inputs, opts);
  // outputs[r][i] receives rank r's inputs[i]: one all-gather of everyone's
  // inputs packed together.
  DLOP_CHECK_ARG(outputs.size() == static_cast<std::size_t>(getSize()), "dlop allgather_coalesced: expects ",
                    getSize(), " output lists, got ", outputs.size());
  for (const auto& t : inputs) check_tensor(t, "allgather_coalesced");
  for (const auto& list : outputs) {
    DLOP_CHECK_ARG(list.size() == inputs.size(), "dlop allgather_coalesced: output list of ", list.size(),
                      " tensors for ", inputs.size(), " inputs");
    for (std::size_t i = 0; i < list.size(); ++i) {
      check_tensor(list[i], "allgather_coalesced");
      check_same_dtype(list[i], inputs[i], "allgather_coalesced");
      DLOP_CHECK_ARG(list[i].numel() == inputs[i].numel(), "dlop allgather_coalesced: output ", i, " has ",
                        list[i].numel(), " elements, input ", inputs[i].numel());
    }
  }
  auto packed = pack_bytes(inputs);
  auto flat = at::empty({packed.numel() * getSize()}, at::kByte);
  auto handle = torch_errors([&] {
    return comm_->allgather(packed.data_ptr(), flat.data_ptr(), packed.nbytes(), DataType::kUInt8,
                            op_options(opts.timeout));
  });
  std::vector<at::Tensor> all_outputs;
  for (const auto& list : outputs) all_outputs.insert(all_outputs.end(), list.begin(), list.end());
  return make_work(OpType::ALLGATHER_COALESCED, {std::move(handle)}, all_outputs, {packed, flat},
                   [all_outputs, flat] { unpack_bytes(flat, 0, all_outputs); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                 std::vector<at::Tensor>& inputs,
                                                                                 const c10d::AllgatherOptions& opts) {
  const auto device = call_device({&inputs, &outputs}, "allgather_into_tensor_coalesced");
  if (auto work = delegated(device, "allgather_into_tensor_coalesced", [&](c10d::Backend& d) { return d.allgather_into_tensor_coalesced(outputs, inputs, opts); })) return *work;
  if (!device.is_cpu()) return on_device::allgather_into_tensor_coalesced(*this, device, outputs, inputs, opts);
  DLOP_CHECK_ARG(outputs.size() == inputs.size(), "dlop allgather_into_tensor_coalesced: ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
  std::vector<sched::Handle> handles;
  std::vector<at::Tensor> keep;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto& input = inputs[i];
    auto& output = outputs[i];
    check_tensor(input, "allgather_into_tensor_coalesced");
    check_tensor(output, "allgather_into_tensor_coalesced");
    check_same_dtype(input, output, "allgather_into_tensor_coalesced");
    DLOP_CHECK_ARG(output.numel() == input.numel() * getSize(), "dlop allgather_into_tensor_coalesced: output ", i,
                      " has ", output.numel(), " elements, expected ", input.numel(), " x ", getSize());
    auto in = input.contiguous();
    auto out = staged(output);
    handles.push_back(torch_errors([&] {
      return comm_->allgather(in.data_ptr(), out.data_ptr(), in.nbytes(), DataType::kUInt8, op_options(opts.timeout));
    }));
    keep.insert(keep.end(), {in, out});
    copies.emplace_back(output, out);
  }
  return make_work(OpType::COALESCED, std::move(handles), outputs, std::move(keep), [copies] {
    for (const auto& [user, stage] : copies) copy_back(user, stage);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  const auto output_list = flatten(outputs);
  const auto device = call_device({&inputs, &output_list}, "gather");
  if (auto work = delegated(device, "gather", [&](c10d::Backend& d) { return d.gather(outputs, inputs, opts); })) return *work;
  if (!device.is_cpu()) return on_device::gather(*this, device, outputs, inputs, opts);
  const auto& input = single_tensor(inputs, "gather");
  check_root(opts.rootRank, "gather");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> list;
  if (getRank() == root) {
    DLOP_CHECK_ARG(outputs.size() == 1, "dlop gather: the root expects one output list, got ", outputs.size());
    list = outputs[0];
    check_list(list, static_cast<std::size_t>(getSize()), input, true, "gather");
  } else {
    DLOP_CHECK_ARG(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                      "dlop gather: only the root (rank ", root, ") takes output tensors");
  }
  auto in = input.contiguous();
  auto flat = at::empty({getRank() == root ? static_cast<int64_t>(in.nbytes()) * getSize() : 0}, at::kByte);
  auto handle = torch_errors([&] {
    return comm_->gather(in.data_ptr(), flat.data_ptr(), in.nbytes(), DataType::kUInt8, root, op_options(opts.timeout));
  });
  return make_work(OpType::GATHER, {std::move(handle)}, list, {in, flat}, [list, flat] { unpack_bytes(flat, 0, list); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  const auto input_list = flatten(inputs);
  const auto device = call_device({&outputs, &input_list}, "scatter");
  if (auto work = delegated(device, "scatter", [&](c10d::Backend& d) { return d.scatter(outputs, inputs, opts); })) return *work;
  if (!device.is_cpu()) return on_device::scatter(*this, device, outputs, inputs, opts);
  const auto& output = single_tensor(outputs, "scatter");
  check_root(opts.rootRank, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor packed = at::empty({0}, at::kByte);
  if (getRank() == root) {
    DLOP_CHECK_ARG(inputs.size() == 1, "dlop scatter: the root expects one input list, got ", inputs.size());
    check_list(inputs[0], static_cast<std::size_t>(getSize()), output, true, "scatter");
    packed = pack_bytes(inputs[0]);
  } else {
    DLOP_CHECK_ARG(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                      "dlop scatter: only the root (rank ", root, ") takes input tensors");
  }
  auto out = staged(output);
  auto handle = torch_errors([&] {
    return comm_->scatter(packed.data_ptr(), out.data_ptr(), out.nbytes(), DataType::kUInt8, root,
                          op_options(opts.timeout));
  });
  return make_work(OpType::SCATTER, {std::move(handle)}, {output}, {packed, out}, [output, out] { copy_back(output, out); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  const auto input_list = flatten(inputs);
  const auto device = call_device({&outputs, &input_list}, "reduce_scatter");
  if (auto work = delegated(device, "reduce_scatter", [&](c10d::Backend& d) { return d.reduce_scatter(outputs, inputs, opts); })) return *work;
  if (!device.is_cpu()) return on_device::reduce_scatter(*this, device, outputs, inputs, opts);
  const auto& output = single_tensor(outputs, "reduce_scatter");
  DLOP_CHECK_ARG(inputs.size() == 1, "dlop reduce_scatter: expects one input list, got ", inputs.size());
  const auto& list = inputs[0];
  check_list(list, static_cast<std::size_t>(getSize()), output, false, "reduce_scatter");
  DLOP_CHECK_ARG(list[static_cast<std::size_t>(getRank())].numel() == output.numel(), "dlop reduce_scatter: input ",
                    getRank(), " has ", list[static_cast<std::size_t>(getRank())].numel(), " elements, the output ",
                    output.numel());
  const auto op = engine_op(opts.reduceOp, "reduce_scatter");
  std::vector<at::Tensor> flat_parts;
  std::vector<std::size_t> counts;
  for (const auto& t : list) {
    flat_parts.push_back(t.reshape(-1));
    counts.push_back(static_cast<std::size_t>(t.numel()) * (t.is_complex() ? 2 : 1));
  }
  const auto factor = premul_factor(opts.reduceOp, list[0]);
  const auto in_place = factor ? std::nullopt : consecutive_bytes(list);
  auto flat = in_place ? in_place->view(list[0].scalar_type()) : at::cat(flat_parts);
  if (factor) flat.mul_(*factor);
  const auto view = reduce_view(flat, opts.reduceOp, "reduce_scatter");
  auto out = staged(output);
  const auto out_view = reduce_view(out, opts.reduceOp, "reduce_scatter");
  auto handle = torch_errors([&] {
    return all_equal(counts)
               ? comm_->reduce_scatter(view.data, out_view.data, out_view.count, view.dtype, op, op_options(opts.timeout))
               : comm_->reduce_scatterv(view.data, out_view.data, counts, view.dtype, op, op_options(opts.timeout));
  });
  return make_work(OpType::REDUCE_SCATTER, {std::move(handle)}, {output}, {flat, out},
                   [output, out] { copy_back(output, out); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  const std::vector<at::Tensor> both{input, output};
  const auto device = call_device({&both}, "reduce_scatter_tensor");
  if (auto work = delegated(device, "reduce_scatter_tensor", [&](c10d::Backend& d) { return d._reduce_scatter_base(output, input, opts); })) return *work;
  if (!device.is_cpu()) return on_device::reduce_scatter_base(*this, device, output, input, opts);
  check_tensor(input, "reduce_scatter_tensor");
  check_tensor(output, "reduce_scatter_tensor");
  check_same_dtype(input, output, "reduce_scatter_tensor");
  DLOP_CHECK_ARG(input.numel() == output.numel() * getSize(), "dlop reduce_scatter_tensor: input has ",
                    input.numel(), " elements, expected ", output.numel(), " x ", getSize());
  const auto op = engine_op(opts.reduceOp, "reduce_scatter_tensor");
  auto in = input.contiguous();
  if (auto factor = premul_factor(opts.reduceOp, in)) in = in * *factor;  // never scale the caller's input
  auto out = staged(output);
  const auto in_view = reduce_view(in, opts.reduceOp, "reduce_scatter_tensor");
  const auto out_view = reduce_view(out, opts.reduceOp, "reduce_scatter_tensor");
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto handle = torch_errors([&] {
    return comm_->reduce_scatter(in_view.data, out_view.data, out_view.count, in_view.dtype, op, options);
  });
  return make_work(OpType::_REDUCE_SCATTER_BASE, {std::move(handle)}, {output}, {in, out}, copy_back_step(output, out),
                   options.caller_waits);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const auto device = call_device({&inputs, &outputs}, "reduce_scatter_tensor_coalesced");
  if (auto work = delegated(device, "reduce_scatter_tensor_coalesced", [&](c10d::Backend& d) { return d.reduce_scatter_tensor_coalesced(outputs, inputs, opts); })) return *work;
  if (!device.is_cpu()) return on_device::reduce_scatter_tensor_coalesced(*this, device, outputs, inputs, opts);
  DLOP_CHECK_ARG(outputs.size() == inputs.size(), "dlop reduce_scatter_tensor_coalesced: ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
  const auto op = engine_op(opts.reduceOp, "reduce_scatter_tensor_coalesced");
  std::vector<sched::Handle> handles;
  std::vector<at::Tensor> keep;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto& input = inputs[i];
    auto& output = outputs[i];
    check_tensor(input, "reduce_scatter_tensor_coalesced");
    check_tensor(output, "reduce_scatter_tensor_coalesced");
    check_same_dtype(input, output, "reduce_scatter_tensor_coalesced");
    DLOP_CHECK_ARG(input.numel() == output.numel() * getSize(), "dlop reduce_scatter_tensor_coalesced: input ", i,
                      " has ", input.numel(), " elements, expected ", output.numel(), " x ", getSize());
    auto in = input.contiguous();
    if (auto factor = premul_factor(opts.reduceOp, in)) in = in * *factor;
    auto out = staged(output);
    const auto in_view = reduce_view(in, opts.reduceOp, "reduce_scatter_tensor_coalesced");
    const auto out_view = reduce_view(out, opts.reduceOp, "reduce_scatter_tensor_coalesced");
    handles.push_back(torch_errors([&] {
      return comm_->reduce_scatter(in_view.data, out_view.data, out_view.count, in_view.dtype, op,
                                   op_options(opts.timeout));
    }));
    keep.insert(keep.end(), {in, out});
    copies.emplace_back(output, out);
  }
  return make_work(OpType::COALESCED, std::move(handles), outputs, std::move(keep), [copies] {
    for (const auto& [user, stage] : copies) copy_back(user, stage);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& output_split_sizes,
                                                               std::vector<int64_t>& input_split_sizes,
                                                               const c10d::AllToAllOptions& opts) {
  const std::vector<at::Tensor> both{input, output};
  const auto device = call_device({&both}, "all_to_all_single");
  if (auto work = delegated(device, "all_to_all_single", [&](c10d::Backend& d) { return d.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts); })) return *work;
  if (!device.is_cpu()) return on_device::alltoall_base(*this, device, output, input, output_split_sizes, input_split_sizes, opts);
  check_tensor(input, "all_to_all_single");
  check_tensor(output, "all_to_all_single");
  check_same_dtype(input, output, "all_to_all_single");
  auto in = input.contiguous();
  auto out = staged(output);
  // Split sizes count rows (the first dimension); the engine counts bytes.
  const auto byte_splits = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const auto row_bytes = rows == 0 ? std::size_t{0} : t.nbytes() / static_cast<std::size_t>(rows);
    std::vector<std::size_t> counts;
    if (splits.empty()) {
      DLOP_CHECK_ARG(rows % getSize() == 0, "dlop all_to_all_single: ", which, " has ", rows,
                        " rows, not divisible by the group size ", getSize());
      counts.assign(static_cast<std::size_t>(getSize()), row_bytes * static_cast<std::size_t>(rows / getSize()));
      return counts;
    }
    DLOP_CHECK_ARG(splits.size() == static_cast<std::size_t>(getSize()), "dlop all_to_all_single: ", splits.size(),
                      " ", which, " split sizes for a group of ", getSize());
    int64_t total = 0;
    for (const auto s : splits) {
      DLOP_CHECK_ARG(s >= 0, "dlop all_to_all_single: negative ", which, " split size ", s);
      total += s;
      counts.push_back(row_bytes * static_cast<std::size_t>(s));
    }
    DLOP_CHECK_ARG(total == rows, "dlop all_to_all_single: ", which, " split sizes add up to ", total,
                      " rows but the tensor has ", rows);
    return counts;
  };
  auto send_counts = byte_splits(in, input_split_sizes, "input");
  auto recv_counts = byte_splits(out, output_split_sizes, "output");
  auto handle = torch_errors([&] {
    return comm_->alltoallv(in.data_ptr(), std::move(send_counts), out.data_ptr(), std::move(recv_counts),
                            DataType::kUInt8, op_options(opts.timeout));
  });
  return make_work(OpType::ALLTOALL_BASE, {std::move(handle)}, {output}, {in, out},
                   [output, out] { copy_back(output, out); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDlop::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  const auto device = call_device({&inputs, &outputs}, "all_to_all");
  if (auto work = delegated(device, "all_to_all", [&](c10d::Backend& d) { return d.alltoall(outputs, inputs, opts); })) return *work;
  if (!device.is_cpu()) return on_device::alltoall(*this, device, outputs, inputs, opts);
  DLOP_CHECK_ARG(!inputs.empty(), "dlop all_to_all: no input tensors");
  check_list(inputs, static_cast<std::size_t>(getSize()), inputs[0], false, "all_to_all");
  check_list(outputs, static_cast<std::size_t>(getSize()), inputs[0], false, "all_to_all");
  auto packed = pack_bytes(inputs);
  auto recv_counts = byte_counts(outputs);
  auto flat = at::empty({static_cast<int64_t>(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}))},
                        at::kByte);
  auto handle = torch_errors([&] {
    return comm_->alltoallv(packed.data_ptr(), byte_counts(inputs), flat.data_ptr(), std::move(recv_counts),
                            DataType::kUInt8, op_options(opts.timeout));
  });
  return make_work(OpType::ALLTOALL, {std::move(handle)}, outputs, {packed, flat},
                   [outputs, flat] { unpack_bytes(flat, 0, outputs); });
}

}  // namespace dlop::backend
