// Copies that involve a dlop_test tensor: the kernel of aten::_copy_from.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

namespace dlop::test_accelerator {

// Copies src into dst (same number of elements, or src broadcastable to dst;
// any dtypes and strides), where at least one of them is a dlop_test tensor.
// The copy is queued on the current stream of the device involved: dst's for
// host-to-device and device-to-device, src's for device-to-host. Between two
// devices it is ordered after the work queued so far on src's current stream,
// and work queued later there waits for it. The host then waits for the copy
// unless it is non_blocking with a pinned host side, or device-to-device.
at::Tensor copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking);

// A dlop_test tensor as a CPU tensor over the same memory (device memory is
// host memory); a CPU tensor as it is. The view's storage is resizable: growing
// it moves it to new CPU memory and leaves the device memory as it was.
at::Tensor on_host(const at::Tensor& t);

// Gives a storage `bytes` of new memory without waiting for the device, as a
// stream-ordered allocator does: the old bytes that fit are copied over on
// the current stream after the work queued there, and the old memory is
// freed once every stream of the device has run what it had queued (which
// may still read it).
void resize_storage(c10::StorageImpl& storage, size_t bytes);

// While one is alive on a thread, that thread's copies run at once on the
// host instead (the CPU fallback, which has synchronised the streams first).
class HostCopyScope {
 public:
  static bool active();

  HostCopyScope();
  ~HostCopyScope();
  HostCopyScope(const HostCopyScope&) = delete;
  HostCopyScope& operator=(const HostCopyScope&) = delete;

 private:
  bool previous_;
};

}  // namespace dlop::test_accelerator
