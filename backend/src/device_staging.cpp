#include "device_staging.hpp"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <map>
#include <mutex>

#include "backend/device_streams.hpp"
#include "backend/torch_error.hpp"
#include "backend/work_dlop.hpp"
#include "core/log.hpp"
#include "stream_waiter.hpp"

namespace dlop::backend {
namespace {

// Buffers come in powers of two from 64 KiB, so a pool serves calls of
// varying sizes with a bounded number of buffers.
constexpr std::size_t kSmallestBuffer = std::size_t{64} << 10;

class PinnedPool {
 public:
  explicit PinnedPool(c10::DeviceType type) : type_(type) {}

  std::shared_ptr<at::Tensor> acquire(std::size_t bytes) {
    const std::size_t size = std::bit_ceil(std::max(bytes, kSmallestBuffer));
    at::Tensor buffer;
    {
      std::lock_guard lock(mutex_);
      auto& free = free_[size];
      if (!free.empty()) {
        buffer = std::move(free.back());
        free.pop_back();
        ++served_;
      }
    }
    if (!buffer.defined()) {
      warn_if_warm(size);
      auto* allocator = at::globalContext().getPinnedMemoryAllocator(type_);
      buffer = at::detail::empty_generic({static_cast<int64_t>(size)}, allocator,
                                         c10::DispatchKeySet(c10::DispatchKey::CPU), at::kByte, std::nullopt);
    }
    // The pool lives as long as the process: leases may outlive any group.
    return std::shared_ptr<at::Tensor>(new at::Tensor(std::move(buffer)), [this, size](at::Tensor* lease) {
      {
        std::lock_guard lock(mutex_);
        free_[size].push_back(std::move(*lease));
      }
      delete lease;
    });
  }

 private:
  // Pinning memory synchronises the device (cudaHostAlloc does): once the
  // pool has served its warm-up, a miss stalls a step, which is worth a
  // warning, once.
  void warn_if_warm(std::size_t size) {
    std::lock_guard lock(mutex_);
    ++misses_;
    if (served_++ < kWarmUpLeases || warned_) return;
    warned_ = true;
    log().warn("dlop: the pinned staging pool for {} had no free {} KiB buffer after {} leases ({} allocated): "
               "pinning memory synchronises the device, so the step that asked for it stalled; more tensors are in "
               "flight at once than before (this is said once)",
               c10::DeviceTypeName(type_), size >> 10, served_, misses_);
  }
  static constexpr std::uint64_t kWarmUpLeases = 256;

  c10::DeviceType type_;
  std::mutex mutex_;
  std::map<std::size_t, std::vector<at::Tensor>> free_;
  std::uint64_t served_ = 0;  // mutex_: leases handed out, from the pool or new
  std::uint64_t misses_ = 0;  // mutex_
  bool warned_ = false;       // mutex_
};

thread_local std::shared_ptr<const sched::ReadyEvent> t_scope_ready;
thread_local bool t_scope_active = false;

}  // namespace

c10::Device call_device(std::initializer_list<const std::vector<at::Tensor>*> lists, std::string_view op) {
  std::optional<c10::Device> device;
  for (const auto* list : lists) {
    for (const auto& t : *list) {
      if (!t.defined()) continue;
      if (!device) {
        device = t.device();
        continue;
      }
      DLOP_CHECK_ARG(t.device() == *device, "dlop ", op, ": tensors on two devices in one call, ", device->str(),
                     " and ", t.device().str(), " (every tensor of a call must be on the same device)");
    }
  }
  return device.value_or(c10::Device(c10::kCPU));
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> all;
  for (const auto& list : lists) all.insert(all.end(), list.begin(), list.end());
  return all;
}

c10::Device with_index(c10::Device device) {
  if (device.has_index()) return device;
  return {device.type(), c10::impl::VirtualGuardImpl(device.type()).getDevice().index()};
}

InternalStreams internal_streams(c10::Device device) {
  device = with_index(device);  // else the streams of whichever device was current first serve index -1
  static std::mutex mutex;
  static std::map<std::pair<int, int>, InternalStreams> streams;
  std::lock_guard lock(mutex);
  const auto key = std::make_pair(static_cast<int>(device.type()), static_cast<int>(device.index()));
  auto it = streams.find(key);
  if (it == streams.end()) {
    const c10::impl::VirtualGuardImpl impl(device.type());
    // High priority, as Gloo's: the copies of a step's collectives go ahead of
    // kernels queued on low-priority streams.
    it = streams
             .emplace(key, InternalStreams{impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true),
                                           impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true),
                                           impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true)})
             .first;
  }
  return it->second;
}

std::shared_ptr<at::Tensor> pinned_bytes(c10::DeviceType type, std::size_t bytes) {
  static std::mutex mutex;
  // Never destroyed: a lease dropped during exit still returns to its pool.
  static auto* pools = new std::map<c10::DeviceType, std::unique_ptr<PinnedPool>>();
  PinnedPool* pool = nullptr;
  {
    std::lock_guard lock(mutex);
    auto& slot = (*pools)[type];
    if (!slot) slot = std::make_unique<PinnedPool>(type);
    pool = slot.get();
  }
  return pool->acquire(bytes);
}

std::shared_ptr<const StreamEvent> StreamEvent::record(c10::Device device, const c10::Stream& stream) {
  auto event = std::make_shared<const StreamEvent>(device, stream);
  when_passed(stream, event->event_, [event] { event->mark_passed(); });
  return event;
}

StreamEvent::StreamEvent(c10::Device device, const c10::Stream& stream)
    : event_(std::make_shared<c10::Event>(device.type())),
      what_(fmt::format("the copy of its inputs from {} (stream {})", device.str(), stream.id())) {
  event_->record(stream);
}

void StreamEvent::mark_passed() const {
  std::function<void()> wake;
  {
    std::lock_guard lock(mutex_);
    passed_at_.store(Clock::now());
    passed_.store(true, std::memory_order_release);
    wake.swap(wake_);
  }
  if (wake) wake();
}

bool StreamEvent::ready() const {
  if (!passed_.load(std::memory_order_acquire)) return false;
  if (started_at_.load() == Clock::time_point{}) started_at_.store(Clock::now());
  return true;
}

bool StreamEvent::notify_when_ready(std::function<void()> wake) const {
  {
    std::lock_guard lock(mutex_);
    if (!passed_.load(std::memory_order_acquire)) {
      wake_ = std::move(wake);
      return true;
    }
  }
  wake();
  return true;
}

std::string StreamEvent::describe() const { return what_; }

void retire_after(const c10::Stream& stream, std::shared_ptr<const c10::Event> event,
                  std::shared_ptr<StagedBuffers> buffers) {
  when_passed(stream, std::move(event), [buffers = std::move(buffers)]() mutable { buffers.reset(); });
}

DeviceCall::~DeviceCall() {
  // A call refused after its copies out were queued (a bad argument found by
  // the host implementation): its buffers wait for those copies.
  if (!handed_off_ && !buffers_->tensors.empty()) {
    auto copied = std::make_shared<c10::Event>(device_.type());
    copied->record(streams_.to_host);
    retire_after(streams_.to_host, std::move(copied), buffers_);
  }
}

DeviceCall::DeviceCall(c10::Device device) : device_(with_index(device)), streams_(internal_streams(device_)) {
  // The copies out start after what the caller queued before the call.
  const c10::impl::VirtualGuardImpl impl(device_.type());
  c10::Event caller(device_.type());
  caller.record(impl.getStream(device_));
  caller.block(streams_.to_host);
}

c10::Stream device_call_stream(c10::Device device) {
  const DeviceCall call(device);
  return call.streams().to_host;
}

at::Tensor DeviceCall::to_host(const at::Tensor& t) {
  auto host = host_like(t);
  if (t.numel() != 0) {
    const c10::StreamGuard guard(streams_.to_host);
    host.copy_(t, /*non_blocking=*/true);
  }
  return host;
}

at::Tensor DeviceCall::host_like(const at::Tensor& t) {
  buffers_->tensors.push_back(t);
  if (t.numel() == 0) return at::empty(t.sizes(), t.options().device(c10::kCPU));
  auto lease = pinned_bytes(device_.type(), t.nbytes());
  auto host = lease->narrow(0, 0, static_cast<int64_t>(t.nbytes())).view(t.scalar_type()).view(t.sizes());
  buffers_->leases.push_back(std::move(lease));
  return host;
}

at::Tensor DeviceCall::host_bytes(std::size_t bytes) {
  if (bytes == 0) return at::empty({0}, at::kByte);
  auto lease = pinned_bytes(device_.type(), bytes);
  auto host = lease->narrow(0, 0, static_cast<int64_t>(bytes));
  buffers_->leases.push_back(std::move(lease));
  return host;
}

std::shared_ptr<const StreamEvent> DeviceCall::staged() {
  auto event = StreamEvent::record(device_, streams_.to_host);
  if (!first_staged_) first_staged_ = event;
  return event;
}

DeviceScope::DeviceScope(std::shared_ptr<const sched::ReadyEvent> ready)
    : previous_(std::move(t_scope_ready)), was_active_(t_scope_active) {
  t_scope_ready = std::move(ready);
  t_scope_active = true;
}

DeviceScope::~DeviceScope() {
  t_scope_ready = std::move(previous_);
  t_scope_active = was_active_;
}

bool DeviceScope::active() { return t_scope_active; }
bool in_device_scope() { return t_scope_active; }
const std::shared_ptr<const sched::ReadyEvent>& DeviceScope::ready() { return t_scope_ready; }

}  // namespace dlop::backend
