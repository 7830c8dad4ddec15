// The memory of dlop_test: device memory and pinned host memory are both
// plain host memory (64-byte aligned), told apart by which allocator handed
// them out, so that a pointer can be asked which device it belongs to and
// whether it is pinned.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <optional>

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

}  // namespace dlop::test_accelerator
