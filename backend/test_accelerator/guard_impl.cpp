// The device guard of dlop_test (PrivateUse1): what c10::DeviceGuard,
// c10::StreamGuard, c10::Event and c10::impl::VirtualGuardImpl call, so that
// device-generic code (and torch.Stream, torch.Event, torch.accelerator) drives
// the streams and events of stream_runtime.
#include "stream_runtime.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace dlop::test_accelerator {
namespace {

Event& as_event(void* event) {
  return *static_cast<Event*>(event);
}

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr auto kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device device) const override {
    const auto previous = getDevice();
    setDevice(device);
    return previous;
  }
  c10::Device getDevice() const override { return {kType, current_device()}; }
  void setDevice(c10::Device device) const override { set_current_device(resolve(device).index()); }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < device_count()) {
      set_current_device(device.index());
    }
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  c10::Stream getStream(c10::Device device) const override { return current_stream(resolve(device).index()); }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return default_stream(resolve(device).index());
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool isHighPriority) const override {
    return pool_stream(resolve(device).index(), isHighPriority);
  }
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    return new_stream(resolve(device).index(), priority);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override { return exchange_stream(stream); }
  bool queryStream(const c10::Stream& stream) const override {
    auto& w = worker(stream);
    return w.passed(w.last_queued());
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    auto& w = worker(stream);
    w.wait_passed(w.last_queued());
  }
  void synchronizeDevice(c10::DeviceIndex index) const override {
    synchronize_device(index < 0 ? current_device() : index);
  }

  // Events: the void* torch keeps is an Event made on first record.
  void record(void** event, const c10::Stream& stream, c10::DeviceIndex index,
              c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(index == -1 || index == stream.device_index(), "dlop_test: an event of device ",
                static_cast<int>(index), " cannot be recorded on a stream of device ",
                static_cast<int>(stream.device_index()));
    if (*event == nullptr) {
      *event = new Event();
    }
    as_event(*event).record(stream);
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event != nullptr) {
      as_event(event).block(stream);
    }
  }
  bool queryEvent(void* event) const override { return event == nullptr || as_event(event).query(); }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      as_event(event).synchronize();
    }
  }
  double elapsedTime(void* start, void* end, c10::DeviceIndex /*index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "dlop_test: elapsed_time needs two recorded events");
    return Event::elapsed_ms(as_event(start), as_event(end));
  }
  void destroyEvent(void* event, c10::DeviceIndex /*index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }

  // No-op: memory is not recycled while a queued operation may still use it
  // (every queued copy holds the storages it reads and writes until it ran),
  // so there is nothing for the allocator to learn.
  void recordDataPtrOnStream(const c10::DataPtr& /*data*/, const c10::Stream& /*stream*/) const override {}
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace dlop::test_accelerator
