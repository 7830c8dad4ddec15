// ProcessGroupDlop for Python: python/dlop/_backend.py passes its constructor
// to torch.distributed.Backend.register_backend.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/device_streams.hpp"
#include "backend/process_group_dlop.hpp"
#include "core/log.hpp"
#include "backend/work_dlop.hpp"
#include "bindings.hpp"

namespace py = pybind11;

namespace dlop::python {
namespace {

// The holder of a WorkDlop in Python: drops its reference with the GIL
// released, as torch's holder of c10d::Work does (the last reference may
// free tensors and wake threads). One intrusive_ptr, like torch's: pybind11
// copies a Work returned as c10::intrusive_ptr<c10d::Work> into it as is.
template <class T>
class GilFreeHolder {
 public:
  GilFreeHolder() = default;
  explicit GilFreeHolder(T* raw) : ptr_(c10::intrusive_ptr<T>::reclaim_copy(raw)) {}
  GilFreeHolder(const GilFreeHolder&) = default;
  GilFreeHolder& operator=(const GilFreeHolder&) = default;
  ~GilFreeHolder() {
    if (ptr_ && PyGILState_Check()) {
      py::gil_scoped_release release;
      ptr_.reset();
    }
  }
  T* get() const noexcept { return ptr_.get(); }

 private:
  c10::intrusive_ptr<T> ptr_;
};

}  // namespace
}  // namespace dlop::python

PYBIND11_DECLARE_HOLDER_TYPE(T, dlop::python::GilFreeHolder<T>, true)

namespace dlop::python {

void bind_backend(py::module_& m) {
  // The base class must be known to pybind11 before a subclass is bound.
  py::module_::import("torch._C._distributed_c10d");
  py::class_<backend::ProcessGroupDlop, c10d::Backend, c10::intrusive_ptr<backend::ProcessGroupDlop>>(
      m, "ProcessGroupDlop", "torch.distributed backend \"dlop\" (a c10d::Backend over dlop's engine)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::vector<int> global_ranks, std::string group_name,
                       bool own_engine) {
             return c10::make_intrusive<backend::ProcessGroupDlop>(
                 store, rank, size, timeout, std::move(global_ranks), std::move(group_name), own_engine);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("global_ranks") = std::vector<int>{}, py::arg("group_name") = std::string{},
           py::arg("own_engine") = false,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "set_device_backend",
          [](backend::ProcessGroupDlop& pg, const c10::intrusive_ptr<c10d::Backend>& delegate, std::string name,
             const std::vector<std::string>& device_types, bool stage_others) {
            std::vector<c10::DeviceType> types;
            for (const auto& type : device_types) types.push_back(c10::Device(type).type());
            pg.set_device_backend(delegate, std::move(name), std::move(types), stage_others);
          },
          py::arg("backend"), py::arg("name"), py::arg("device_types"), py::arg("stage_others"),
          "Delegates calls on tensors of these device types to `backend` (see DLOP_DEVICE_BACKEND)")
      .def(
          "share_device_when_used",
          [](backend::ProcessGroupDlop& pg, py::function sharer) {
            // Dropped with the GIL held, whichever thread lets go of it last;
            // left alone once the interpreter is gone (a group never destroyed).
            std::shared_ptr<py::function> held(new py::function(std::move(sharer)), [](py::function* f) {
              if (!Py_IsInitialized()) return;
              py::gil_scoped_acquire gil;
              delete f;
            });
            pg.share_device_when_used(
                [held](c10::Device device) -> std::variant<backend::ProcessGroupDlop::DeviceMemory, std::string> {
                  py::gil_scoped_acquire gil;
                  const py::object answer = (*held)(device.str());
                  if (py::isinstance<py::str>(answer)) return answer.cast<std::string>();
                  auto [slabs, slot_bytes] = answer.cast<std::pair<std::vector<at::Tensor>, std::size_t>>();
                  return backend::ProcessGroupDlop::DeviceMemory{std::move(slabs), slot_bytes};
                });
          },
          py::arg("sharer"),
          "sharer(device) is called once, at the first all-reduce on a device: (every rank's device memory, "
          "slot bytes) to reduce in it, or a str saying why the group stages")
      .def_property_readonly(
          "shared_device",
          [](backend::ProcessGroupDlop& pg) -> py::object {
            std::optional<c10::Device> device;
            {
              // Its lock may be held by a thread that waits for the GIL.
              const py::gil_scoped_release released;
              device = pg.shared_device_in_use();
            }
            return device ? py::cast(device->str()) : py::none();
          },
          "the device whose memory the group's all-reduces reduce in, or None (staged or delegated)")
      .def_property_readonly(
          "device_backend",
          [](backend::ProcessGroupDlop& pg) -> py::object {
            const auto& delegate = pg.device_backend();
            return delegate ? py::cast(delegate) : py::none();
          },
          "the backend accelerator tensors are delegated to (DLOP_DEVICE_BACKEND), or None")
      .def_property_readonly(
          "gradients_in_flight",
          [](backend::ProcessGroupDlop& pg) {
            const auto& credits = pg.communicator().data_credits();
            credits->check_outside();  // a delegated device work's end is learned by asking
            return credits->gradients_in_flight();
          },
          "collectives (dlop's own and delegated ones) the engine's data credits count as in flight")
      .def_property_readonly("hosts", [](backend::ProcessGroupDlop& pg) { return pg.communicator().hosts(); })
      .def_property_readonly("store_namespace", &backend::ProcessGroupDlop::store_namespace,
                             "this attempt's namespace of the group's store: \"dlop/<session id>\"");
  // Known to pybind11 so that a returned Work is found by its own type at
  // once: an unknown subclass of c10d::Work costs every call two failed type
  // look-ups (each hashing the mangled name) before the fallback to the base.
  py::class_<backend::WorkDlop, c10d::Work, GilFreeHolder<backend::WorkDlop>>(
      m, "WorkDlop", "the torch.distributed Work of a dlop collective");
  m.def(
      "_log",
      [](const std::string& level, const std::string& message) {
        dlop::log().log(spdlog::level::from_str(level), "{}", message);
      },
      py::arg("level"), py::arg("message"), "logs through dlop's logger (DLOP_LOG_LEVEL)");
  m.def(
      "_device_call_stream",
      [](const c10::Device& device) {
        const auto s = backend::device_call_stream(device);
        return std::make_tuple(s.id(), static_cast<int>(s.device_index()));
      },
      "(stream id, device index) of the stream a staged call on `device` copies to the host on (for tests)");
}

}  // namespace dlop::python
