// The memory of dlop_test: device memory and pinned host memory are both
// plain host memory (64-byte aligned), told apart by which allocator handed
// them out, so that a pointer can be asked which device it belongs to and
// whether it is pinned.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <optional>
#include <string>

namespace dlop::test_accelerator {

// The allocator of dlop_test tensors (c10::GetAllocator(PrivateUse1)); the
// memory belongs to the calling thread's current device.
c10::Allocator* device_allocator();
// The pinned host allocator (at::getHostAllocator(PrivateUse1)).
c10::Allocator* host_allocator();

// The device whose memory holds ptr, if any.
std::optional<c10::Device> device_of(const void* ptr);
// Whether ptr lies in memory of the pinned host allocator.
bool is_pinned(const void* ptr);

// Device memory that other processes can map, as a GPU's memory is shared
// between processes by handle: `bytes` of device `index` in an anonymous
// shared-memory file (memfd), whose handle is "<pid>:<fd>". The memory is the
// device's (device_of says so) and goes back to the system when the last
// process mapping it lets it go: a killed process leaves nothing behind.
struct SharedDeviceMemory {
  c10::DataPtr data;
  std::string handle;
};
SharedDeviceMemory shared_device_memory(std::size_t bytes, c10::DeviceIndex index);
// Maps another process's shared device memory onto device `index` here.
c10::DataPtr open_shared_device_memory(const std::string& handle, std::size_t bytes, c10::DeviceIndex index);

}  // namespace dlop::test_accelerator
