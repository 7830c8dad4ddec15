#include "copy.hpp"

#include "allocators.hpp"
#include "stream_runtime.hpp"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/CPUAllocator.h>

#include <mutex>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace dlop::test_accelerator {
namespace {

thread_local bool tls_host_copies = false;

// One queued copy. It keeps the storages it reads and writes alive until it
// has run. Its timing makes missing waits visible: with a delay it reads its
// source halfway through and writes its destination only at the end, so a
// reader that does not wait for it sees old data, and a writer that does not
// wait for it changes what it reads.
struct QueuedCopy {
  at::Tensor src;  // CPU views of the memory
  at::Tensor dst;
  std::vector<c10::Storage> keep_alive;
  Timing timing;
  Engine* engine = nullptr;  // the copy engine of its direction; none between devices

  void operator()() const {
    std::unique_lock<Engine> hold;
    if (engine != nullptr) {
      hold = std::unique_lock<Engine>(*engine);
    }
    // The caller's autograd state is not this thread's: the copy is data only
    // (a CPU side may be a leaf that requires grad, copied into under no_grad).
    const at::AutoDispatchBelowADInplaceOrView data_only;
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const double bytes = static_cast<double>(dst.numel()) * static_cast<double>(dst.element_size());
    const std::chrono::duration<double> transfer(timing.copy_gbps > 0 ? bytes / (timing.copy_gbps * 1e9) : 0.0);
    const auto end = start + timing.delay + std::chrono::duration_cast<Clock::duration>(transfer);
    if (timing.delay.count() == 0) {
      dst.copy_(src);
    } else {
      std::this_thread::sleep_until(start + timing.delay / 2);
      auto staged = at::empty(dst.sizes(), dst.options());
      staged.copy_(src);
      std::this_thread::sleep_until(end);
      dst.copy_(staged);
    }
    std::this_thread::sleep_until(end);
  }
};

}  // namespace

at::Tensor on_host(const at::Tensor& t) {
  if (!t.is_privateuseone()) {
    return t;
  }
  return at::for_blob(t.data_ptr(), t.sizes())
      .strides(t.strides())
      .options(t.options().device(at::kCPU))
      .allocator(c10::GetCPUAllocator())
      .resizeable_storage()
      .make_tensor();
}

// A CPU view of t's memory made here, for a queued copy to hold: never the
// caller's own tensor, whose last reference dropped on the stream's thread
// would take Python's lock to release its Python object, and deadlock with a
// caller that waits for the stream holding it (Work.synchronize() does).
at::Tensor host_alias(const at::Tensor& t) {
  return at::for_blob(t.data_ptr(), t.sizes())
      .strides(t.strides())
      .options(t.options().device(at::kCPU))
      .make_tensor();
}

void resize_storage(c10::StorageImpl& storage, size_t bytes) {
  const auto index = storage.device().index();
  const c10::DeviceGuard guard(storage.device());
  const auto kept = std::min(bytes, storage.nbytes());
  auto old = std::make_shared<c10::DataPtr>(storage.set_data_ptr(storage.allocator()->allocate(bytes)));
  storage.set_nbytes(bytes);
  if (kept > 0) {
    worker(current_stream(index)).enqueue([old, to = storage.mutable_data(), kept] {
      std::memcpy(to, old->get(), kept);
    });
  }
  for (auto* w : stream_workers(index)) {
    w->enqueue([old] {});  // the last of these frees the old memory
  }
}

bool HostCopyScope::active() {
  return tls_host_copies;
}

HostCopyScope::HostCopyScope() : previous_(tls_host_copies) {
  tls_host_copies = true;
}

HostCopyScope::~HostCopyScope() {
  tls_host_copies = previous_;
}

// Checks what it can on the caller: an error on a stream would only surface at
// the next wait for it.
at::Tensor copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(src.defined() && dst.defined(), "dlop_test: copy of an undefined tensor");
  TORCH_CHECK(src.is_privateuseone() || dst.is_privateuseone(), "dlop_test: a copy without a dlop_test tensor");
  TORCH_CHECK((src.is_cpu() || src.is_privateuseone()) && (dst.is_cpu() || dst.is_privateuseone()),
              "dlop_test: copies only to and from the CPU and dlop_test, not ", src.device(), " -> ", dst.device());
  if (dst.numel() == 0) {
    return dst;
  }
  if (tls_host_copies) {
    auto host_dst = on_host(dst);
    auto host_src = on_host(src);
    const bool same_memory = host_dst.data_ptr() == host_src.data_ptr() && dst.dtype() == src.dtype() &&
                             dst.sizes() == src.sizes() && dst.strides() == src.strides();
    if (!same_memory) {  // the fallback writing back a result it wrote in place
      host_dst.copy_(host_src);
    }
    return dst;
  }

  TORCH_CHECK(at::is_expandable_to(src.sizes(), dst.sizes()), "dlop_test: cannot copy a tensor of shape ",
              src.sizes(), " into one of shape ", dst.sizes());
  const bool to_device = dst.is_privateuseone();
  const auto index = to_device ? dst.device().index() : src.device().index();
  const auto stream = current_stream(index);
  auto& w = worker(stream);

  // Between devices: after what src's current stream has queued, and before
  // what it queues next (src may be overwritten there once the copy is done).
  std::optional<c10::Stream> other;
  if (src.is_privateuseone() && dst.is_privateuseone() && src.device() != dst.device()) {
    other = current_stream(src.device().index());
    Event src_ready;
    src_ready.record(*other);
    src_ready.block(stream);
  }

  // To or from the host, the link's rate on its direction's copy engine.
  // Within a device, device memory's rate for reading and writing each byte
  // (a GPU runs such a copy as a kernel; the model takes no engine for it).
  // Between two devices, free (peer links are not modelled), but still late.
  Engine* copy_engine = nullptr;
  auto copy_timing = timing();
  if (src.is_cpu() || dst.is_cpu()) {
    copy_engine = &engine(index, to_device ? EngineKind::kToDevice : EngineKind::kToHost);
  } else if (src.device() == dst.device()) {
    copy_timing.copy_gbps = copy_timing.device_copy_gbps() / 2;
  } else {
    copy_timing.copy_gbps = 0;
  }
  const auto position = w.enqueue(
      QueuedCopy{host_alias(src), host_alias(dst), {src.storage(), dst.storage()}, copy_timing, copy_engine});

  if (other) {
    Event copied;
    copied.record(stream);
    copied.block(*other);
  }

  const at::Tensor* host_side = src.is_cpu() ? &src : dst.is_cpu() ? &dst : nullptr;
  if (host_side != nullptr && !(non_blocking && is_pinned(host_side->data_ptr()))) {
    w.wait_passed(position);
  }
  return dst;
}

}  // namespace dlop::test_accelerator
