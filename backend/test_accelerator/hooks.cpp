// The PrivateUse1 hooks of dlop_test: what torch asks an accelerator through
// at::globalContext() (availability, current device, pinned memory for
// pin_memory()/is_pinned(), storage resizing).
#include "allocators.hpp"
#include "copy.hpp"
#include "stream_runtime.hpp"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>


namespace dlop::test_accelerator {
namespace {

struct Hooks final : at::PrivateUse1HooksInterface {
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override { return true; }

  c10::DeviceIndex deviceCount() const override { return device_count(); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_current_device(index); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const auto previous = current_device();
    set_current_device(index);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }

  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return host_allocator(); }
  at::Device getDeviceFromPtr(void* data) const override {
    const auto device = device_of(data);
    TORCH_CHECK(device.has_value(), "dlop_test: ", data, " is not dlop_test memory");
    return *device;
  }

  // Storage.resize_() of a dlop_test storage (FSDP frees and refills its
  // unsharded parameters so): no wait for the device (copy.hpp).
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "dlop_test: this storage cannot be resized");
    resize_storage(*impl, bytes);
  }
};

Hooks g_hooks;

struct Registrar {
  Registrar() { at::RegisterPrivateUse1HooksInterface(&g_hooks); }
} g_registrar;

}  // namespace
}  // namespace dlop::test_accelerator
