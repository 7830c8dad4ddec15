// dlop.testing._accelerator: loading it registers the dlop_test device (the
// other files register themselves when the library loads); these functions
// are what dlop/testing/accelerator.py needs beyond torch.Stream and torch.Event.
#include "allocators.hpp"
#include "compute.hpp"
#include "recording_backend.hpp"
#include "stream_runtime.hpp"

#include <ATen/Context.h>
#include <ATen/core/CachingHostAllocator.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <stdexcept>
#include <tuple>

namespace py = pybind11;
namespace ta = dlop::test_accelerator;

namespace {

// (stream_id, device_index, device_type), the arguments of torch.Stream.
std::tuple<int64_t, int64_t, int64_t> stream_args(const c10::Stream& s) {
  return {s.id(), s.device_index(), static_cast<int64_t>(s.device_type())};
}

py::dict timing_dict(const ta::Timing& t) {
  py::dict d;
  d["delay_us"] = static_cast<int64_t>(t.delay.count());
  d["copy_gbps"] = t.copy_gbps;
  d["mem_gbps"] = t.mem_gbps;
  d["op_us"] = static_cast<int64_t>(t.op.count());
  d["tflops"] = t.tflops;
  d["query_us"] = static_cast<int64_t>(t.query.count());
  return d;
}

// A uint8 tensor over `data` (which it keeps) on data's device.
at::Tensor byte_tensor(c10::DataPtr data, std::size_t bytes) {
  auto* ptr = data.get();
  const auto device = data.device();
  auto owner = std::make_shared<c10::DataPtr>(std::move(data));
  return at::from_blob(
      ptr, {static_cast<int64_t>(bytes)}, [owner](void*) mutable { owner.reset(); },
      at::TensorOptions().dtype(at::kByte).device(device));
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
  m.def("share_key", [] { return ta::share_key(); });
  m.def("timing", [] { return timing_dict(ta::timing()); });
  m.def(
      "configure",
      [](const py::kwargs& changes) {
        auto t = ta::timing();
        const auto previous = timing_dict(t);
        for (const auto& [key, value] : changes) {
          const auto name = py::cast<std::string>(key);
          if (name == "delay_us") {
            t.delay = std::chrono::microseconds(py::cast<int64_t>(value));
          } else if (name == "copy_gbps") {
            t.copy_gbps = py::cast<double>(value);
          } else if (name == "mem_gbps") {
            t.mem_gbps = py::cast<double>(value);
          } else if (name == "op_us") {
            t.op = std::chrono::microseconds(py::cast<int64_t>(value));
          } else if (name == "tflops") {
            t.tflops = py::cast<double>(value);
          } else if (name == "query_us") {
            t.query = std::chrono::microseconds(py::cast<int64_t>(value));
          } else {
            throw py::type_error("configure: unknown setting " + name +
                                 " (delay_us, copy_gbps, mem_gbps, op_us, tflops, query_us)");
          }
        }
        ta::configure(t);
        return previous;
      },
      "Changes the timing of the work queued from now on (delay_us, copy_gbps, mem_gbps, op_us, tflops, query_us); "
      "returns the previous settings as a dict.");
  m.def("host_waits", [] { return ta::host_waits(); });
  m.def("compute_counts", [] {
    const auto c = ta::compute_counts();
    return std::make_tuple(c.queued, c.immediate);
  });
  m.def("stream_priority", [](int64_t stream_id, int index) {
    return ta::stream_priority(c10::Stream(c10::Stream::UNSAFE,
                                           c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)),
                                           stream_id));
  });
  m.def(
      "shared_device_memory",
      [](std::size_t bytes, int index) {
        auto shared = ta::shared_device_memory(bytes, static_cast<c10::DeviceIndex>(index));
        return std::make_tuple(byte_tensor(std::move(shared.data), bytes), shared.handle);
      },
      "(uint8 tensor of `bytes` on device `index`, handle): device memory other processes can open");
  m.def(
      "open_shared_device_memory",
      [](const std::string& handle, std::size_t bytes, int index) {
        return byte_tensor(ta::open_shared_device_memory(handle, bytes, static_cast<c10::DeviceIndex>(index)), bytes);
      },
      "Another process's shared device memory (its handle), as a uint8 tensor on device `index` here");
  ta::bind_recording_backend(m);
  // For the tests: what C++ code gets from torch's host allocator API.
  m.def("_host_allocator_check", [] {
    auto* allocator = at::getHostAllocator(c10::DeviceType::PrivateUse1);
    const auto data = allocator->allocate(64);
    return allocator == ta::host_allocator() &&
           at::globalContext().isPinnedPtr(data.get(), c10::DeviceType::PrivateUse1);
  });
}
