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
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "backend/torch_error.hpp"
#include "backend/work_dlop.hpp"

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
      }
    }
    if (!buffer.defined()) {
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
  c10::DeviceType type_;
  std::mutex mutex_;
  std::map<std::size_t, std::vector<at::Tensor>> free_;
};

// Holds what staged calls still use until their end events pass, polling
// them (a device's blocking event wait may spin a core): the caller need not
// keep its Work, and a pinned buffer goes back to its pool only once no copy
// can touch it.
class Retirer {
 public:
  static Retirer& instance() {
    static auto* retirer = new Retirer();  // never destroyed: leases may be dropped at exit
    return *retirer;
  }
  void retire(std::function<bool()> done, std::shared_ptr<StagedBuffers> buffers) {
    {
      std::lock_guard lock(mutex_);
      pending_.push_back({std::move(done), std::move(buffers)});
    }
    wake_.notify_one();
  }

 private:
  struct Pending {
    std::function<bool()> done;
    std::shared_ptr<StagedBuffers> buffers;
  };
  Retirer() {
    std::thread([this] { run(); }).detach();  // lives as long as the process, like the pools it feeds
  }
  void run() {
    pthread_setname_np(pthread_self(), "dlop-retire");
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return !pending_.empty(); });
      // Calls end in the order their copies were queued on one stream: the
      // first one not done holds the rest.
      while (!pending_.empty() && pending_.front().done()) {
        auto done = std::move(pending_.front());
        pending_.pop_front();
        lock.unlock();
        done = {};
        lock.lock();
      }
      if (!pending_.empty()) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(500));
        lock.lock();
      }
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
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

InternalStreams internal_streams(c10::Device device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, InternalStreams> streams;
  std::lock_guard lock(mutex);
  const auto key = std::make_pair(static_cast<int>(device.type()), static_cast<int>(device.index()));
  auto it = streams.find(key);
  if (it == streams.end()) {
    const c10::impl::VirtualGuardImpl impl(device.type());
    it = streams.emplace(key, InternalStreams{impl.getStreamFromGlobalPool(device), impl.getStreamFromGlobalPool(device)})
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

namespace {
// A copy out waits for the caller's stream to reach the call, which on a GPU
// is often many kernels behind the thread that launched them. The engine asks
// ready() at each of its passes, and each query is a driver call competing
// with that thread's kernel launches: asked at every pass (millions of times
// a second), DDP on one H100 shared by two ranks ran at 0.62x the images/s of
// the same run delegated to Gloo. So the device is asked at once, then at
// intervals doubling up to the longest, which is all a late copy can add to
// its call.
constexpr std::int64_t kFirstQueryIntervalNs = 16'000;
constexpr std::int64_t kLongestQueryIntervalNs = 256'000;

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

StreamEvent::StreamEvent(c10::Device device, const c10::Stream& stream)
    : event_(device.type()),
      what_(fmt::format("the copy of its inputs from {} (stream {})", device.str(), stream.id())),
      interval_ns_(kFirstQueryIntervalNs) {
  event_.record(stream);
}

bool StreamEvent::ready() const {
  if (passed_.load(std::memory_order_acquire)) return true;
  const std::int64_t now = steady_ns();
  if (now < next_query_ns_.load(std::memory_order_relaxed)) return false;
  if (event_.query()) {
    passed_.store(true, std::memory_order_release);
    return true;
  }
  const std::int64_t interval = interval_ns_.load(std::memory_order_relaxed);
  next_query_ns_.store(now + interval, std::memory_order_relaxed);
  interval_ns_.store(std::min(interval * 2, kLongestQueryIntervalNs), std::memory_order_relaxed);
  return false;
}

std::string StreamEvent::describe() const { return what_; }

void retire_when_done(std::function<bool()> done, std::shared_ptr<StagedBuffers> buffers) {
  Retirer::instance().retire(std::move(done), std::move(buffers));
}

DeviceCall::~DeviceCall() {
  // A call refused after its copies out were queued (a bad argument found by
  // the host implementation): its buffers wait for those copies.
  if (!handed_off_ && !buffers_->tensors.empty()) {
    auto staged_now = staged();
    retire_when_done([staged_now] { return staged_now->ready(); }, buffers_);
  }
}

DeviceCall::DeviceCall(c10::Device device) : device_(device), streams_(internal_streams(device)) {
  if (device_.index() < 0) {
    device_ = c10::Device(device_.type(), c10::impl::VirtualGuardImpl(device_.type()).getDevice().index());
  }
  // The copies out start after what the caller queued before the call.
  const c10::impl::VirtualGuardImpl impl(device_.type());
  c10::Event caller(device_.type());
  caller.record(impl.getStream(device_));
  caller.block(streams_.to_host);
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

std::shared_ptr<const StreamEvent> DeviceCall::staged() const {
  return std::make_shared<const StreamEvent>(device_, streams_.to_host);
}

void DeviceCall::wait_on_host() { staged()->event().synchronize(); }

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
