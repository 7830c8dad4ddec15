// Registers the device allocator (c10::SetAllocator) and the pinned host
// allocator (at::setHostAllocator) of PrivateUse1. Neither caches: memory goes
// back to the system when its last owner drops it, and a queued copy owns the
// storages it uses until it has run.
#include "allocators.hpp"

#include "stream_runtime.hpp"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace dlop::test_accelerator {
namespace {

// Live allocations of both allocators: base address -> (size, owner).
// The owner is a dlop_test device, or nullopt for pinned host memory.
class Blocks {
 public:
  void insert(const void* base, size_t size, std::optional<c10::Device> owner) {
    std::lock_guard lock(mutex_);
    blocks_[address(base)] = {size, owner};
  }
  void erase(const void* base) {
    std::lock_guard lock(mutex_);
    blocks_.erase(address(base));
  }
  // The block holding ptr: found, and its owner.
  std::pair<bool, std::optional<c10::Device>> find(const void* ptr) const {
    std::lock_guard lock(mutex_);
    auto it = blocks_.upper_bound(address(ptr));
    if (it == blocks_.begin()) {
      return {false, std::nullopt};
    }
    --it;
    if (address(ptr) >= it->first + it->second.size) {
      return {false, std::nullopt};
    }
    return {true, it->second.owner};
  }

 private:
  static uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }
  struct Block {
    size_t size;
    std::optional<c10::Device> owner;
  };
  mutable std::mutex mutex_;
  std::map<uintptr_t, Block> blocks_;
};

Blocks& blocks() {
  static auto* instance = new Blocks();  // leaked: frees may come during exit
  return *instance;
}

void release(void* ptr) {
  if (ptr != nullptr) {
    blocks().erase(ptr);
    c10::free_cpu(ptr);
  }
}

void* acquire(size_t bytes, std::optional<c10::Device> owner) {
  if (bytes == 0) {
    return nullptr;
  }
  void* ptr = c10::alloc_cpu(bytes);
  blocks().insert(ptr, bytes, owner);
  return ptr;
}

// A raw copy between two allocations (Storage clones, resizes): first lets
// the streams of the devices involved finish, as the host reads or writes.
void copy_now(void* dst, const void* src, size_t bytes) {
  for (const void* p : {static_cast<const void*>(dst), src}) {
    if (auto device = device_of(p)) {
      synchronize_device(device->index());
    }
  }
  if (bytes > 0) {
    std::memcpy(dst, src, bytes);
  }
}

struct DeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    const c10::Device device(c10::DeviceType::PrivateUse1, current_device());
    void* ptr = acquire(bytes, device);
    return {ptr, ptr, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dst, const void* src, size_t bytes) const override { copy_now(dst, src, bytes); }
};

// As cudaHostAlloc does, pinning memory waits for every device to finish
// what is queued on it: a pinned allocation inside a step stalls the step.
void synchronize_all_devices() {
  if (on_stream_worker()) {
    return;  // a stream cannot wait for itself
  }
  for (c10::DeviceIndex index = 0; index < device_count(); ++index) {
    synchronize_device(index);
  }
}

struct HostAllocator final : at::HostAllocator {
  c10::DataPtr allocate(size_t bytes) override {
    if (bytes > 0) {
      synchronize_all_devices();
    }
    void* ptr = acquire(bytes, std::nullopt);
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dst, const void* src, size_t bytes) const override { copy_now(dst, src, bytes); }

  // Nothing is cached, so nothing to track or empty.
  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

DeviceAllocator g_device_allocator;
HostAllocator g_host_allocator;

}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);
REGISTER_HOST_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_host_allocator);

c10::Allocator* device_allocator() {
  return &g_device_allocator;
}

c10::Allocator* host_allocator() {
  return &g_host_allocator;
}

std::optional<c10::Device> device_of(const void* ptr) {
  return blocks().find(ptr).second;
}

namespace {

// A mapping of shared device memory, and the file it maps (kept open by its
// creator, so that other processes can open it through /proc).
struct Mapping {
  void* base;
  std::size_t bytes;
  int fd;
};

// The creator's mapping going is exported memory freed: on a GPU the caching
// allocator hands the block to the next tensor while peers may still map it.
// It poisons itself (all bits set: NaN in floats, -1 in integers), so that a
// peer that reads it after the free gets a wrong result here too.
constexpr int kFreedPattern = 0xFF;

void unmap(void* context) {
  auto* mapping = static_cast<Mapping*>(context);
  blocks().erase(mapping->base);
  if (mapping->fd >= 0) std::memset(mapping->base, kFreedPattern, mapping->bytes);
  munmap(mapping->base, mapping->bytes);
  if (mapping->fd >= 0) close(mapping->fd);
  delete mapping;
}

c10::DataPtr map_shared(int fd, std::size_t bytes, c10::DeviceIndex index, bool keep_fd, const std::string& what) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    close(fd);
    TORCH_CHECK(false, "dlop_test: cannot map shared device memory ", what, ": ", std::strerror(error));
  }
  if (!keep_fd) {
    close(fd);
    fd = -1;
  }
  const c10::Device device(c10::DeviceType::PrivateUse1, index);
  blocks().insert(base, bytes, device);
  return {base, new Mapping{base, bytes, fd}, &unmap, device};
}

}  // namespace

SharedDeviceMemory shared_device_memory(std::size_t bytes, c10::DeviceIndex index) {
  TORCH_CHECK(bytes > 0, "dlop_test: shared device memory of 0 bytes");
  const int fd = memfd_create("dlop_test-device-memory", MFD_CLOEXEC);
  TORCH_CHECK(fd >= 0, "dlop_test: memfd_create: ", std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    close(fd);
    TORCH_CHECK(false, "dlop_test: cannot size shared device memory to ", bytes, " bytes: ", std::strerror(error));
  }
  auto handle = std::to_string(getpid()) + ":" + std::to_string(fd);
  return {map_shared(fd, bytes, index, /*keep_fd=*/true, handle), std::move(handle)};
}

c10::DataPtr open_shared_device_memory(const std::string& handle, std::size_t bytes, c10::DeviceIndex index) {
  const auto colon = handle.find(':');
  TORCH_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < handle.size(),
              "dlop_test: not a shared device memory handle: '", handle, "'");
  const auto path = "/proc/" + handle.substr(0, colon) + "/fd/" + handle.substr(colon + 1);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "dlop_test: cannot open shared device memory ", handle, " (", path, "): ", std::strerror(errno));
  struct stat info {};
  if (fstat(fd, &info) != 0 || static_cast<std::size_t>(info.st_size) < bytes) {
    close(fd);
    TORCH_CHECK(false, "dlop_test: shared device memory ", handle, " holds fewer than ", bytes, " bytes");
  }
  return map_shared(fd, bytes, index, /*keep_fd=*/false, handle);
}

bool is_pinned(const void* ptr) {
  const auto [found, owner] = blocks().find(ptr);
  return found && !owner.has_value();
}

}  // namespace dlop::test_accelerator
