// dlop.testing._accelerator: loading it registers the dlop_test device (the
// other files register themselves when the library loads); these functions
// are what dlop/testing/accelerator.py needs beyond torch.Stream and torch.Event.
#include "allocators.hpp"
#include "stream_runtime.hpp"

#include <ATen/Context.h>
#include <ATen/core/CachingHostAllocator.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <tuple>

namespace py = pybind11;
namespace ta = dlop::test_accelerator;

namespace {

// (stream_id, device_index, device_type), the arguments of torch.Stream.
std::tuple<int64_t, int64_t, int64_t> stream_args(const c10::Stream& s) {
  return {s.id(), s.device_index(), static_cast<int64_t>(s.device_type())};
}

}  // namespace

PYBIND11_MODULE(_accelerator, m) {
  m.doc() = "The test accelerator dlop_test (PrivateUse1); use it through dlop.testing.accelerator";
  // A bad DLOP_TEST_* value fails the import, naming the variable.
  try {
    (void)ta::timing();
  } catch (const c10::Error& e) {
    throw std::invalid_argument(e.what_without_backtrace());
  }
  at::globalContext().lazyInitDevice(c10::DeviceType::PrivateUse1);

  m.def("device_count", [] { return static_cast<int>(ta::device_count()); });
  m.def("current_device", [] { return static_cast<int>(ta::current_device()); });
  m.def("set_device", [](int index) { ta::set_current_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("default_stream",
        [](int index) { return stream_args(ta::default_stream(static_cast<c10::DeviceIndex>(index))); });
  m.def(
      "synchronize", [](int index) { ta::synchronize_device(static_cast<c10::DeviceIndex>(index)); },
      py::call_guard<py::gil_scoped_release>());
  m.def("event_queries", [] { return ta::event_queries(); });
  m.def("timing", [] {
    const auto t = ta::timing();
    return std::make_tuple(static_cast<int64_t>(t.delay.count()), t.copy_gbps);
  });
  m.def(
      "configure",
      [](std::optional<int64_t> delay_us, std::optional<double> copy_gbps) {
        auto t = ta::timing();
        const auto previous = std::make_tuple(static_cast<int64_t>(t.delay.count()), t.copy_gbps);
        if (delay_us) {
          t.delay = std::chrono::microseconds(*delay_us);
        }
        if (copy_gbps) {
          t.copy_gbps = *copy_gbps;
        }
        ta::configure(t);
        return previous;
      },
      py::arg("delay_us") = py::none(), py::arg("copy_gbps") = py::none(),
      "Sets the delay (microseconds) and the copy rate (GB/s, 0: unlimited) of the copies queued from now on; "
      "returns the previous (delay_us, copy_gbps).");
  // For the tests: what C++ code gets from torch's host allocator API.
  m.def("_host_allocator_check", [] {
    auto* allocator = at::getHostAllocator(c10::DeviceType::PrivateUse1);
    const auto data = allocator->allocate(64);
    return allocator == ta::host_allocator() &&
           at::globalContext().isPinnedPtr(data.get(), c10::DeviceType::PrivateUse1);
  });
}
