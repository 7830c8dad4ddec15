// The aten kernels of dlop_test (PrivateUse1). Only what cannot run on the
// CPU over a copy is written here: tensor creation, views (they must share
// memory), resizing, copies and record_stream. Every other operator goes to
// the fallback at the end (compute.hpp), which queues it on its stream or,
// where it cannot, runs it at once.
#include "allocators.hpp"
#include "compute.hpp"
#include "copy.hpp"
#include "stream_runtime.hpp"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <vector>

namespace dlop::test_accelerator {
namespace {

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

c10::Device target(std::optional<c10::Device> device, std::optional<at::Layout> layout,
                   std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == at::Layout::Strided, "dlop_test: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "dlop_test: only CPU tensors can be pinned");
  return resolve(device.value_or(c10::Device(c10::DeviceType::PrivateUse1)));
}

at::Tensor empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                 std::optional<c10::Device> device, std::optional<bool> pin_memory,
                 std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(target(device, layout, pin_memory));
  return at::detail::empty_generic(size, device_allocator(), kKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  const c10::DeviceGuard guard(target(device, layout, pin_memory));
  return at::detail::empty_strided_generic(size, stride, device_allocator(), kKeys, c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset) {
    offset = storage_offset->expect_int();
  }
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

// Growing gives the storage new memory without waiting for the device
// (copy.hpp); then torch's resize finds room and only sets the shape.
const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  if (self.sizes() == sizes && !memory_format) {
    return self;
  }
  const c10::DeviceGuard guard(self.device());
  auto* storage = self.storage().unsafeGetStorageImpl();
  const auto needed = at::detail::computeStorageNbytesContiguous(sizes, self.dtype().itemsize(),
                                                                 static_cast<size_t>(self.storage_offset()));
  if (needed > storage->nbytes() && storage->resizable()) {
    resize_storage(*storage, needed);
  }
  return at::native::resize_(self, sizes, memory_format);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  const c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor copy_from_kernel(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  return copy_from(self, dst, non_blocking);
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, /*non_blocking=*/false);
}

// The CPU fallback's way to the CPU. In the fallback: views of the device
// memory, so that the CPU kernel reads and writes it in place (which also
// covers operators that modify an argument their schema does not mark, such
// as native_batch_norm's running statistics). Elsewhere: copies.
std::vector<at::Tensor> to_cpu(at::TensorList tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    out.push_back(HostCopyScope::active() ? on_host(t) : t.to(at::kCPU));
  }
  return out;
}

// Queued copies hold the storages they use until they have run, so there is
// nothing to record (see recordDataPtrOnStream in guard_impl.cpp).
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1 && self.is_privateuseone(),
              "dlop_test: record_stream needs a dlop_test tensor and stream");
}

}  // namespace

// What a dlop_test tensor is: its memory and views.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("set_.source_Tensor", set_tensor);
}

// Copies between a dlop_test device and the host, and the convolutions.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", copy_from_kernel);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("record_stream", record_stream);
  m.impl("_to_cpu", to_cpu);
  // Composite in torch, but they pick the convolution backend by device and
  // would choose the "overrideable" one, which has no CPU kernel: run the
  // operators themselves on the CPU instead.
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&compute>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&compute>());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&compute>());
}

}  // namespace dlop::test_accelerator
