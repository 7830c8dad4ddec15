// ProcessGroupDlop's collectives. Each enters collective() (collective.hpp)
// with the call itself, for a delegate, and its host entry (host_*), which
// checks the tensors, stages what is not contiguous (or has to be packed,
// like a list of outputs) and submits to the engine; the Work copies staged
// results back before completing its future. Accelerator tensors reach the
// same host entry from the staging (staged_ops.hpp), on their host copies.
#include <ATen/ATen.h>

#include <cstring>
#include <numeric>
#include <optional>

#include "backend/process_group_dlop.hpp"
#include "backend/torch_error.hpp"
#include "collective.hpp"
#include "sparse_allreduce.hpp"
#include "staged_ops.hpp"
#include "tensor_args.hpp"
#include "backend/work_dlop.hpp"

namespace dlop::backend {
namespace {

using c10d::OpType;
using on_device::Staged;
using coll::DataType;
using on_device::Tensors;
using on_device::TensorLists;
using on_device::WorkPtr;

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

// The one tensor of a call to or from a root rank, and the root checked (the
// root tensor too where the options name one).
template <class Options>
const at::Tensor& rooted_tensor(const Tensors& tensors, const Options& opts, int size, std::string_view op) {
  const auto& tensor = single_tensor(tensors, op);
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < size, "dlop ", op, ": invalid root rank ", opts.rootRank,
                    " for a group of ", size);
  if constexpr (requires { opts.rootTensor; }) {
    DLOP_CHECK_ARG(opts.rootTensor == 0, "dlop ", op, ": invalid root tensor ", opts.rootTensor);
  }
  return tensor;
}

// A tensor reduced in place: its stage (the tensor itself where contiguous),
// premultiplied for a PREMUL_SUM, and the stage as elements to reduce.
struct ReduceStage {
  at::Tensor tensor;
  BufferView view;
};
ReduceStage reduce_stage(const at::Tensor& tensor, const c10d::ReduceOp& op, std::string_view name) {
  auto stage = staged(tensor);
  if (auto factor = premul_factor(op, stage)) stage.mul_(*factor);
  return {stage, reduce_view(stage, op, name)};
}

// An (input, output) pair of a call that gathers into the output or scatters
// the input (`gathers`): dense, of one dtype, the whole `size` times the part.
// `index`: the pair's place in a coalesced call.
void check_pair(const at::Tensor& input, const at::Tensor& output, int size, bool gathers, std::string_view op,
                std::optional<std::size_t> index = std::nullopt) {
  check_tensor(input, op);
  check_tensor(output, op);
  check_same_dtype(input, output, op);
  const auto& whole = gathers ? output : input;
  const auto& part = gathers ? input : output;
  DLOP_CHECK_ARG(whole.numel() == part.numel() * size, "dlop ", op, ": ", gathers ? "output" : "input",
                 index ? c10::str(" ", *index) : std::string(), " has ", whole.numel(), " elements, expected ",
                 part.numel(), " x ", size);
}

void check_counts(const Tensors& outputs, const Tensors& inputs, std::string_view op) {
  DLOP_CHECK_ARG(outputs.size() == inputs.size(), "dlop ", op, ": ", outputs.size(), " outputs for ", inputs.size(),
                 " inputs");
}

// A coalesced call's pairs (check_pair), one engine call each:
// `submit(in, out)`, given the input made contiguous (which it may replace
// with a copy) and the output's stage; `finish` copies the stages back.
struct PairCalls {
  std::vector<sched::Handle> handles;
  std::vector<at::Tensor> keep;
  std::function<void()> finish;
};
template <class Submit>
PairCalls each_pair(const Tensors& outputs, const Tensors& inputs, int size, bool gathers, std::string_view op,
                    Submit&& submit) {
  PairCalls calls;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_pair(inputs[i], outputs[i], size, gathers, op, i);
    auto in = inputs[i].contiguous();
    auto out = staged(outputs[i]);
    calls.handles.push_back(torch_errors([&] { return submit(in, out); }));
    calls.keep.insert(calls.keep.end(), {in, out});
    copies.emplace_back(outputs[i], out);
  }
  calls.finish = [copies] {
    for (const auto& [user, stage] : copies) copy_back(user, stage);
  };
  return calls;
}

}  // namespace

WorkPtr ProcessGroupDlop::allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) {
  const bool sparse = tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse;
  const auto host = [&](auto& t, auto&) { return host_allreduce(t, opts); };
  // The host code refuses sparse tensors off the CPU.
  return collective(OpType::ALLREDUCE, "allreduce", tensors, tensors,
                    [&](c10d::Backend& b, auto& out, auto&) { return b.allreduce(out, opts); },
                    [&](c10::Device d) {
                      return sparse ? host(tensors, tensors) : Staged::allreduce(*this, d, tensors, opts);
                    },
                    host);
}

WorkPtr ProcessGroupDlop::allreduce_coalesced(Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return collective(OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors, tensors,
                    [&](c10d::Backend& b, auto& out, auto&) { return b.allreduce_coalesced(out, opts); },
                    [&](c10::Device d) { return Staged::allreduce_coalesced(*this, d, tensors, opts); },
                    [&](auto& t, auto&) { return host_allreduce_coalesced(t, opts); });
}

WorkPtr ProcessGroupDlop::broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) {
  return collective(OpType::BROADCAST, "broadcast", tensors, tensors,
                    [&](c10d::Backend& b, auto& out, auto&) { return b.broadcast(out, opts); },
                    [&](c10::Device d) { return Staged::broadcast(*this, d, tensors, opts); },
                    [&](auto& t, auto&) { return host_broadcast(t, opts); });
}

WorkPtr ProcessGroupDlop::reduce(Tensors& tensors, const c10d::ReduceOptions& opts) {
  return collective(OpType::REDUCE, "reduce", tensors, tensors,
                    [&](c10d::Backend& b, auto& out, auto&) { return b.reduce(out, opts); },
                    [&](c10::Device d) { return Staged::reduce(*this, d, tensors, opts); },
                    [&](auto& t, auto&) { return host_reduce(t, opts); });
}

WorkPtr ProcessGroupDlop::allgather(TensorLists& outputs, Tensors& inputs, const c10d::AllgatherOptions& opts) {
  return collective(OpType::ALLGATHER, "allgather", outputs, inputs,
                    [&](c10d::Backend& b, auto& out, auto& in) { return b.allgather(out, in, opts); },
                    [&](auto& out, auto& in) { return host_allgather(out, in, opts); });
}

WorkPtr ProcessGroupDlop::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return collective(OpType::_ALLGATHER_BASE, "all_gather_into_tensor", output, input,
                    [&](c10d::Backend& b, auto& out, auto& in) { return b._allgather_base(out, in, opts); },
                    [&](auto& out, auto& in) { return host_allgather_base(out, in, opts); });
}

WorkPtr ProcessGroupDlop::allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                                              const c10d::AllgatherOptions& opts) {
  return collective(OpType::ALLGATHER_COALESCED, "allgather_coalesced", outputs, inputs,
                    [&](c10d::Backend& b, auto& out, auto& in) { return b.allgather_coalesced(out, in, opts); },
                    [&](c10::Device d) { return Staged::allgather_coalesced(*this, d, outputs, inputs, opts); },
                    [&](auto& out, auto& in) { return host_allgather_coalesced(out, in, opts); });
}

WorkPtr ProcessGroupDlop::allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  return collective(OpType::COALESCED, "allgather_into_tensor_coalesced", outputs, inputs,
                    [&](c10d::Backend& b, auto& out, auto& in) {
                      return b.allgather_into_tensor_coalesced(out, in, opts);
                    }, [&](auto& out, auto& in) { return host_allgather_into_tensor_coalesced(out, in, opts); });
}

WorkPtr ProcessGroupDlop::gather(TensorLists& outputs, Tensors& inputs, const c10d::GatherOptions& opts) {
  return collective(OpType::GATHER, "gather", outputs, inputs,
                    [&](c10d::Backend& b, auto& out, auto& in) { return b.gather(out, in, opts); },
                    [&](auto& out, auto& in) { return host_gather(out, in, opts); });
}

WorkPtr ProcessGroupDlop::scatter(Tensors& outputs, TensorLists& inputs, const c10d::ScatterOptions& opts) {
  return collective(OpType::SCATTER, "scatter", outputs, inputs,
                    [&](c10d::Backend& b, auto& out, auto& in) { return b.scatter(out, in, opts); },
                    [&](c10::Device d) { return Staged::scatter(*this, d, outputs, inputs, opts); },
                    [&](auto& out, auto& in) { return host_scatter(out, in, opts); });
}

WorkPtr ProcessGroupDlop::reduce_scatter(Tensors& outputs, TensorLists& inputs,
                                         const c10d::ReduceScatterOptions& opts) {
  return collective(OpType::REDUCE_SCATTER, "reduce_scatter", outputs, inputs,
                    [&](c10d::Backend& b, auto& out, auto& in) { return b.reduce_scatter(out, in, opts); },
                    [&](c10::Device d) { return Staged::reduce_scatter(*this, d, outputs, inputs, opts); },
                    [&](auto& out, auto& in) { return host_reduce_scatter(out, in, opts); });
}

WorkPtr ProcessGroupDlop::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                               const c10d::ReduceScatterOptions& opts) {
  return collective(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", output, input,
                    [&](c10d::Backend& b, auto& out, auto& in) { return b._reduce_scatter_base(out, in, opts); },
                    [&](c10::Device d) { return Staged::reduce_scatter_base(*this, d, output, input, opts); },
                    [&](auto& out, auto& in) { return host_reduce_scatter_base(out, in, opts); });
}

WorkPtr ProcessGroupDlop::reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  return collective(OpType::COALESCED, "reduce_scatter_tensor_coalesced", outputs, inputs,
                    [&](c10d::Backend& b, auto& out, auto& in) {
                      return b.reduce_scatter_tensor_coalesced(out, in, opts);
                    },
                    [&](c10::Device d) {
                      return Staged::reduce_scatter_tensor_coalesced(*this, d, outputs, inputs, opts);
                    }, [&](auto& out, auto& in) { return host_reduce_scatter_tensor_coalesced(out, in, opts); });
}

WorkPtr ProcessGroupDlop::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
                                        std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return collective(OpType::ALLTOALL_BASE, "all_to_all_single", output, input,
                    [&](c10d::Backend& b, auto& out, auto& in) {
                      return b.alltoall_base(out, in, output_split_sizes, input_split_sizes, opts);
                    },
                    [&](auto& out, auto& in) {
                      return host_alltoall_base(out, in, output_split_sizes, input_split_sizes, opts);
                    });
}

WorkPtr ProcessGroupDlop::alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) {
  return collective(OpType::ALLTOALL, "all_to_all", outputs, inputs,
                    [&](c10d::Backend& b, auto& out, auto& in) { return b.alltoall(out, in, opts); },
                    [&](c10::Device d) { return Staged::alltoall(*this, d, outputs, inputs, opts); },
                    [&](auto& out, auto& in) { return host_alltoall(out, in, opts); });
}

// The host entries (process_group_dlop.hpp): the calls on host tensors.

WorkPtr ProcessGroupDlop::host_allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse) {
    auto gathers = start_sparse_allreduce(*comm_, tensors[0], opts, op_options(opts.timeout));
    return make_work(OpType::ALLREDUCE, std::move(gathers.handles), {tensors[0]}, std::move(gathers.keep_alive),
                     std::move(gathers.finish));
  }
  const auto& tensor = single_tensor(tensors, "allreduce");
  const auto op = engine_op(opts.reduceOp, "allreduce");
  const auto stage = reduce_stage(tensor, opts.reduceOp, "allreduce");
  const auto& view = stage.view;
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto handle =
      torch_errors([&] { return comm_->allreduce(view.data, view.data, view.count, view.dtype, op, options); });
  return make_work(OpType::ALLREDUCE, {std::move(handle)}, {tensor}, kept_stage(tensor, stage.tensor),
                   copy_back_step(tensor, stage.tensor), options.caller_waits);
}

WorkPtr ProcessGroupDlop::host_allreduce_coalesced(Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) {
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

WorkPtr ProcessGroupDlop::host_broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) {
  const auto& tensor = rooted_tensor(tensors, opts, getSize(), "broadcast");
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

WorkPtr ProcessGroupDlop::host_reduce(Tensors& tensors, const c10d::ReduceOptions& opts) {
  const auto& tensor = rooted_tensor(tensors, opts, getSize(), "reduce");
  const auto op = engine_op(opts.reduceOp, "reduce");
  const auto stage = reduce_stage(tensor, opts.reduceOp, "reduce");
  const auto& view = stage.view;
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto handle = torch_errors([&] {
    return comm_->reduce(view.data, view.data, view.count, view.dtype, op, static_cast<int>(opts.rootRank), options);
  });
  return make_work(OpType::REDUCE, {std::move(handle)}, {tensor}, kept_stage(tensor, stage.tensor),
                   copy_back_step(tensor, stage.tensor), options.caller_waits);
}

WorkPtr ProcessGroupDlop::host_allgather(TensorLists& outputs, Tensors& inputs, const c10d::AllgatherOptions& opts) {
  const auto& input = single_tensor(inputs, "allgather");
  DLOP_CHECK_ARG(outputs.size() == 1, "dlop allgather: expects one output list, got ", outputs.size());
  const auto& list = outputs[0];
  check_list(list, static_cast<std::size_t>(getSize()), input, false, "allgather");
  const auto counts = byte_counts(list);
  DLOP_CHECK_ARG(counts[static_cast<std::size_t>(getRank())] == input.nbytes(), "dlop allgather: this rank's output ",
                 "tensor has ", list[static_cast<std::size_t>(getRank())].numel(), " elements, its input ",
                 input.numel());
  auto in = input.contiguous();
  const auto total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  auto flat = at::empty({static_cast<int64_t>(total)}, at::kByte);
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto handle = torch_errors([&] {
    return all_equal(counts)
               ? comm_->allgather(in.data_ptr(), flat.data_ptr(), in.nbytes(), DataType::kUInt8, options)
               : comm_->allgatherv(in.data_ptr(), flat.data_ptr(), counts, DataType::kUInt8, options);
  });
  return make_work(OpType::ALLGATHER, {std::move(handle)}, list, {in, flat},
                   [list, flat] { unpack_bytes(flat, 0, list); }, options.caller_waits);
}

WorkPtr ProcessGroupDlop::host_allgather_base(at::Tensor& output, at::Tensor& input,
                                              const c10d::AllgatherOptions& opts) {
  check_pair(input, output, getSize(), /*gathers=*/true, "all_gather_into_tensor");
  auto in = input.contiguous();
  auto out = staged(output);
  auto options = op_options(opts.timeout);
  options.caller_waits = caller_waits(opts);
  auto handle = torch_errors(
      [&] { return comm_->allgather(in.data_ptr(), out.data_ptr(), in.nbytes(), DataType::kUInt8, options); });
  return make_work(OpType::_ALLGATHER_BASE, {std::move(handle)}, {output}, {in, out}, copy_back_step(output, out),
                   options.caller_waits);
}

WorkPtr ProcessGroupDlop::host_allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                                              const c10d::AllgatherOptions& opts) {
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

WorkPtr ProcessGroupDlop::host_allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  check_counts(outputs, inputs, "allgather_into_tensor_coalesced");
  auto calls = each_pair(outputs, inputs, getSize(), /*gathers=*/true, "allgather_into_tensor_coalesced",
                         [&](const at::Tensor& in, const at::Tensor& out) {
                           return comm_->allgather(in.data_ptr(), out.data_ptr(), in.nbytes(), DataType::kUInt8,
                                                   op_options(opts.timeout));
                         });
  return make_work(OpType::COALESCED, std::move(calls.handles), outputs, std::move(calls.keep),
                   std::move(calls.finish));
}

WorkPtr ProcessGroupDlop::host_gather(TensorLists& outputs, Tensors& inputs, const c10d::GatherOptions& opts) {
  const auto& input = rooted_tensor(inputs, opts, getSize(), "gather");
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
    return comm_->gather(in.data_ptr(), flat.data_ptr(), in.nbytes(), DataType::kUInt8, root,
                         op_options(opts.timeout));
  });
  return make_work(OpType::GATHER, {std::move(handle)}, list, {in, flat},
                   [list, flat] { unpack_bytes(flat, 0, list); });
}

WorkPtr ProcessGroupDlop::host_scatter(Tensors& outputs, TensorLists& inputs, const c10d::ScatterOptions& opts) {
  const auto& output = rooted_tensor(outputs, opts, getSize(), "scatter");
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
  return make_work(OpType::SCATTER, {std::move(handle)}, {output}, {packed, out},
                   [output, out] { copy_back(output, out); });
}

WorkPtr ProcessGroupDlop::host_reduce_scatter(Tensors& outputs, TensorLists& inputs,
                                         const c10d::ReduceScatterOptions& opts) {
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
    const auto options = op_options(opts.timeout);
    return all_equal(counts)
               ? comm_->reduce_scatter(view.data, out_view.data, out_view.count, view.dtype, op, options)
               : comm_->reduce_scatterv(view.data, out_view.data, counts, view.dtype, op, options);
  });
  return make_work(OpType::REDUCE_SCATTER, {std::move(handle)}, {output}, {flat, out},
                   [output, out] { copy_back(output, out); });
}

WorkPtr ProcessGroupDlop::host_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                               const c10d::ReduceScatterOptions& opts) {
  check_pair(input, output, getSize(), /*gathers=*/false, "reduce_scatter_tensor");
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
  return make_work(OpType::_REDUCE_SCATTER_BASE, {std::move(handle)}, {output}, {in, out},
                   copy_back_step(output, out), options.caller_waits);
}

WorkPtr ProcessGroupDlop::host_reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  check_counts(outputs, inputs, "reduce_scatter_tensor_coalesced");
  const auto op = engine_op(opts.reduceOp, "reduce_scatter_tensor_coalesced");
  auto calls = each_pair(outputs, inputs, getSize(), /*gathers=*/false, "reduce_scatter_tensor_coalesced",
                         [&](at::Tensor& in, const at::Tensor& out) {
                           if (auto factor = premul_factor(opts.reduceOp, in)) in = in * *factor;
                           const auto in_view = reduce_view(in, opts.reduceOp, "reduce_scatter_tensor_coalesced");
                           const auto out_view = reduce_view(out, opts.reduceOp, "reduce_scatter_tensor_coalesced");
                           return comm_->reduce_scatter(in_view.data, out_view.data, out_view.count, in_view.dtype,
                                                        op, op_options(opts.timeout));
                         });
  return make_work(OpType::COALESCED, std::move(calls.handles), outputs, std::move(calls.keep),
                   std::move(calls.finish));
}

WorkPtr ProcessGroupDlop::host_alltoall_base(at::Tensor& output, at::Tensor& input,
                                             std::vector<int64_t>& output_split_sizes,
                                             std::vector<int64_t>& input_split_sizes,
                                             const c10d::AllToAllOptions& opts) {
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

WorkPtr ProcessGroupDlop::host_alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) {
  DLOP_CHECK_ARG(!inputs.empty(), "dlop all_to_all: no input tensors");
  check_list(inputs, static_cast<std::size_t>(getSize()), inputs[0], false, "all_to_all");
  check_list(outputs, static_cast<std::size_t>(getSize()), inputs[0], false, "all_to_all");
  auto packed = pack_bytes(inputs);
  auto recv_counts = byte_counts(outputs);
  const auto total = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
  auto flat = at::empty({static_cast<int64_t>(total)}, at::kByte);
  auto handle = torch_errors([&] {
    return comm_->alltoallv(packed.data_ptr(), byte_counts(inputs), flat.data_ptr(), std::move(recv_counts),
                            DataType::kUInt8, op_options(opts.timeout));
  });
  return make_work(OpType::ALLTOALL, {std::move(handle)}, outputs, {packed, flat},
                   [outputs, flat] { unpack_bytes(flat, 0, outputs); });
}

}  // namespace dlop::backend
