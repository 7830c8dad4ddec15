#include "compute.hpp"

#include "allocators.hpp"
#include "copy.hpp"
#include "stream_runtime.hpp"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <c10/core/DeviceGuard.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace dlop::test_accelerator {
namespace {

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

std::atomic<uint64_t> g_queued{0};
std::atomic<uint64_t> g_immediate{0};

// What an operator's schema allows, worked out once per operator.
struct Plan {
  bool queueable = false;
  // Per return: the argument it writes and returns (in-place and out=
  // operators), or -1 for a new tensor.
  std::vector<int> returns_argument;
};

bool is_tensor_or_list(const c10::TypePtr& type) {
  if (type->kind() == c10::TensorType::Kind) {
    return true;
  }
  const auto list = type->cast<c10::ListType>();
  return list && list->getElementType()->kind() == c10::TensorType::Kind;
}

bool names_device_or_generator(const c10::TypePtr& type) {
  const auto inner = type->kind() == c10::OptionalType::Kind ? type->expectRef<c10::OptionalType>().getElementType()
                                                              : type;
  return inner->kind() == c10::DeviceObjType::Kind || inner->kind() == c10::GeneratorType::Kind;
}

Plan make_plan(const c10::FunctionSchema& schema) {
  Plan plan;
  const auto& args = schema.arguments();
  for (const auto& a : args) {
    if (names_device_or_generator(a.type())) {
      return plan;
    }
  }
  // Dropout draws from the default generator without naming it.
  if (schema.name().find("dropout") != std::string::npos) {
    return plan;
  }
  for (const auto& r : schema.returns()) {
    if (!is_tensor_or_list(r.type())) {
      return plan;  // a number or a flag: the host needs it now
    }
    int written = -1;
    if (const auto* alias = r.alias_info()) {
      if (!alias->isWrite()) {
        return plan;  // a view, which the fallback cannot make either
      }
      for (size_t j = 0; j < args.size(); ++j) {
        if (args[j].alias_info() && args[j].alias_info()->beforeSets() == alias->beforeSets()) {
          written = static_cast<int>(j);
        }
      }
      if (written < 0) {
        return plan;
      }
    }
    plan.returns_argument.push_back(written);
  }
  plan.queueable = true;
  return plan;
}

// Plans by operator; an operator whose meta kernel failed is not queued again.
class Plans {
 public:
  Plan get(const c10::OperatorHandle& op) {
    std::lock_guard lock(mutex_);
    auto it = plans_.find(op.operator_name());
    if (it == plans_.end()) {
      it = plans_.emplace(op.operator_name(), make_plan(op.schema())).first;
    }
    return it->second;
  }
  void never_queue(const c10::OperatorHandle& op) {
    std::lock_guard lock(mutex_);
    plans_[op.operator_name()].queueable = false;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<c10::OperatorName, Plan> plans_;
};

Plans& plans() {
  static auto* instance = new Plans();  // leaked: operators may run during exit
  return *instance;
}

// Applies fn to every tensor an argument holds, keeping the argument's form.
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    return fn(value.toTensor());
  }
  if (value.isTensorList()) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : value.toTensorVector()) {
      out.push_back(fn(t));
    }
    return out;
  }
  if (value.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const auto& t : value.toOptionalTensorVector()) {
      out.push_back(t ? std::optional<at::Tensor>(fn(*t)) : std::nullopt);
    }
    return out;
  }
  return value;
}

template <typename Fn>
void for_each_tensor(c10::ArrayRef<c10::IValue> values, Fn&& fn) {
  for (const auto& v : values) {
    (void)map_tensors(v, [&](const at::Tensor& t) {
      if (t.defined()) {
        fn(t);
      }
      return t;
    });
  }
}

// The devices of an operator's tensor arguments (and of a Device argument).
std::vector<bool> devices_used(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  std::vector<bool> used(static_cast<size_t>(device_count()), false);
  const auto args = torch::jit::last(stack, op.schema().arguments().size());
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (t.is_privateuseone()) {
      used[static_cast<size_t>(t.device().index())] = true;
    }
  });
  for (const auto& arg : args) {
    if (arg.isDevice() && arg.toDevice().is_privateuseone()) {
      used[static_cast<size_t>(resolve(arg.toDevice()).index())] = true;
    }
  }
  return used;
}

// Runs an operator on the CPU as if it ran on the current streams of its
// devices, with no delay: once they have run what is queued on them.
void run_now(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto used = devices_used(op, *stack);
  for (size_t index = 0; index < used.size(); ++index) {
    if (used[index]) {
      auto& w = worker(current_stream(static_cast<c10::DeviceIndex>(index)));
      w.wait_passed(w.last_queued());
    }
  }
  g_immediate.fetch_add(1, std::memory_order_relaxed);
  const HostCopyScope host_copies;
  at::native::cpu_fallback(op, stack);
}

// A CPU scalar stays as it is: operators take one beside tensors of any
// device, and a Python number's wrapper must stay on the CPU.
at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined() || (t.is_cpu() && t.dim() == 0)) {
    return t;
  }
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

// What the stream's worker computes on: CPU views of device memory, and
// copies of CPU arguments as they are now (the host may change them before
// the operator runs).
at::Tensor for_worker(const at::Tensor& t) {
  if (!t.defined()) {
    return t;
  }
  if (!t.is_privateuseone()) {
    return t.clone();
  }
  if (t.numel() == 0) {
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU));
  }
  return on_host(t);
}

at::Tensor allocate_like(const at::Tensor& meta, c10::DeviceIndex index) {
  if (!meta.defined()) {
    return meta;
  }
  const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, index));
  return at::detail::empty_strided_generic(meta.sizes(), meta.strides(), device_allocator(), kKeys,
                                           meta.scalar_type());
}

// The one dlop_test device of the arguments, or nullopt when there is none
// or several.
std::optional<c10::DeviceIndex> only_device(c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::DeviceIndex> device;
  bool several = false;
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (t.is_privateuseone()) {
      several = several || (device && *device != t.device().index());
      device = t.device().index();
    }
  });
  return several ? std::nullopt : device;
}

// The queued operator: runs the CPU kernel on the worker's views, writes the
// new outputs, and takes at least its modelled time on the compute engine.
struct QueuedOperator {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;     // for_worker() views and copies
  std::vector<c10::IValue> outputs;  // CPU views of the new outputs (None where an argument is returned)
  std::vector<c10::Storage> keep_alive;
  std::chrono::nanoseconds cost;
  Engine* compute_engine;

  void operator()() const {
    const std::lock_guard<Engine> hold(*compute_engine);
    const auto start = std::chrono::steady_clock::now();
    {
      const at::AutoDispatchBelowADInplaceOrView data_only;
      torch::jit::Stack stack(args.begin(), args.end());
      op.callBoxed(stack);
      for (size_t i = 0; i < outputs.size(); ++i) {
        (void)map_tensors(outputs[i], [&, list_index = size_t{0}](const at::Tensor& out) mutable {
          const auto& result = stack[i];
          const at::Tensor& from = result.isTensor() ? result.toTensor() : result.toTensorVector()[list_index++];
          if (out.defined() && out.numel() > 0) {
            out.copy_(from);
          }
          return out;
        });
      }
    }
    std::this_thread::sleep_until(start + cost);
  }
};

std::chrono::nanoseconds modelled_cost(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                       const std::vector<c10::IValue>& meta_returns) {
  const auto t = timing();
  at::Tensor first;
  if (!meta_returns.empty() && meta_returns[0].isTensor()) {
    first = meta_returns[0].toTensor();
  }
  double seconds = 0;
  if (t.tflops > 0) {
    seconds = modelled_flops(op, args, first) / (t.tflops * 1e12);
  }
  return t.op + std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9));
}

// Queues op on its device's current stream; false when it must run now.
bool queue(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto plan = plans().get(op);
  if (!plan.queueable) {
    return false;
  }
  const auto n = op.schema().arguments().size();
  const auto view = torch::jit::last(*stack, n);
  const std::vector<c10::IValue> args(view.begin(), view.end());
  const auto device = only_device(args);
  if (!device) {
    return false;
  }
  // Written arguments must be device tensors.
  for (const int j : plan.returns_argument) {
    bool on_device = true;
    if (j >= 0) {
      for_each_tensor({args[static_cast<size_t>(j)]}, [&](const at::Tensor& t) { on_device &= t.is_privateuseone(); });
    }
    if (!on_device) {
      return false;
    }
  }

  // The output shapes, from the meta kernel.
  std::vector<c10::IValue> meta_args;
  meta_args.reserve(n);
  for (const auto& a : args) {
    meta_args.push_back(map_tensors(a, to_meta));
  }
  torch::jit::Stack meta(meta_args.begin(), meta_args.end());
  try {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.callBoxed(meta);
  } catch (const std::exception&) {
    // No meta kernel, or shapes that depend on the data: run it now, which
    // also raises the real error for a bad call.
    plans().never_queue(op);
    return false;
  }
  for (const int j : plan.returns_argument) {  // an out= argument that would be resized
    if (j >= 0 && args[static_cast<size_t>(j)].isTensor() &&
        meta_args[static_cast<size_t>(j)].toTensor().sizes() != args[static_cast<size_t>(j)].toTensor().sizes()) {
      return false;
    }
  }

  QueuedOperator task{op, {}, {}, {}, modelled_cost(op, args, meta), &engine(*device, EngineKind::kCompute)};
  std::vector<c10::IValue> results;
  for (size_t i = 0; i < plan.returns_argument.size(); ++i) {
    const int j = plan.returns_argument[i];
    if (j >= 0) {
      results.push_back(args[static_cast<size_t>(j)]);
      task.outputs.emplace_back();
    } else {
      results.push_back(map_tensors(meta[i], [&](const at::Tensor& m) { return allocate_like(m, *device); }));
      task.outputs.push_back(map_tensors(results.back(), for_worker));
    }
  }
  for (const auto& a : args) {
    task.args.push_back(map_tensors(a, for_worker));
  }
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (t.is_privateuseone()) {
      task.keep_alive.push_back(t.storage());
    }
  });
  for_each_tensor(results, [&](const at::Tensor& t) { task.keep_alive.push_back(t.storage()); });

  worker(current_stream(*device)).enqueue(std::move(task));
  g_queued.fetch_add(1, std::memory_order_relaxed);
  torch::jit::drop(*stack, n);
  for (auto& r : results) {
    stack->push_back(std::move(r));
  }
  return true;
}

int64_t dim_or_zero(const at::Tensor& t, int64_t dim) {
  return t.defined() && t.dim() > dim ? t.size(dim) : 0;
}

// A convolution's multiply-adds per output element: the weight's elements per output channel.
double per_output(const at::Tensor& weight) {
  return weight.defined() && weight.dim() > 0 && weight.size(0) > 0
             ? static_cast<double>(weight.numel()) / static_cast<double>(weight.size(0))
             : 0.0;
}

}  // namespace

void compute(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!queue(op, stack)) {
    run_now(op, stack);
  }
}

ComputeCounts compute_counts() {
  return {g_queued.load(), g_immediate.load()};
}

double modelled_flops(const c10::OperatorHandle& op, const torch::jit::Stack& args, const at::Tensor& first_output) {
  const auto tensor = [&](size_t i) {
    return i < args.size() && args[i].isTensor() ? args[i].toTensor() : at::Tensor();
  };
  const auto matmul = [](const at::Tensor& a, const at::Tensor& b) {
    if (!a.defined() || !b.defined() || a.dim() < 2) {
      return 0.0;
    }
    return 2.0 * static_cast<double>(a.numel()) * static_cast<double>(dim_or_zero(b, b.dim() - 1));
  };
  const auto& name = op.schema().name();
  if (name == "aten::mm" || name == "aten::bmm") {
    return matmul(tensor(0), tensor(1));
  }
  if (name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::addbmm") {
    return matmul(tensor(1), tensor(2));
  }
  if (name == "aten::convolution") {
    const bool transposed = args.size() > 6 && args[6].isBool() && args[6].toBool();
    const auto& over = transposed ? tensor(0) : first_output;
    return over.defined() ? 2.0 * static_cast<double>(over.numel()) * per_output(tensor(1)) : 0.0;
  }
  if (name == "aten::convolution_backward") {
    double passes = 0;
    if (args.size() > 10 && args[10].isBoolList()) {
      const auto mask = args[10].toBoolList();
      passes = (mask.get(0) ? 1.0 : 0.0) + (mask.get(1) ? 1.0 : 0.0);
    }
    return passes * 2.0 * static_cast<double>(tensor(0).numel()) * per_output(tensor(2));
  }
  return 0.0;
}

}  // namespace dlop::test_accelerator
