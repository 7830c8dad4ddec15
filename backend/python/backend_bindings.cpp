// ProcessGroupDlop for Python: python/dlop/_backend.py passes its constructor
// to torch.distributed.Backend.register_backend.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/process_group_dlop.hpp"
#include "bindings.hpp"

namespace py = pybind11;

namespace dlop::python {

void bind_backend(py::module_& m) {
  // The base class must be known to pybind11 before a subclass is bound.
  py::module_::import("torch._C._distributed_c10d");
  py::class_<backend::ProcessGroupDlop, c10d::Backend, c10::intrusive_ptr<backend::ProcessGroupDlop>>(
      m, "ProcessGroupDlop", "torch.distributed backend \"dlop\" (a c10d::Backend over dlop's engine)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::vector<int> global_ranks, std::string group_name) {
             return c10::make_intrusive<backend::ProcessGroupDlop>(store, rank, size, timeout,
                                                                   std::move(global_ranks), std::move(group_name));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("global_ranks") = std::vector<int>{}, py::arg("group_name") = std::string{},
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("hosts", [](backend::ProcessGroupDlop& pg) { return pg.communicator().hosts(); });
}

}  // namespace dlop::python
