// dlop._C: the extension module. Each area binds its own part.
#include "bindings.hpp"
#include "core/trace.hpp"

PYBIND11_MODULE(_C, m) {
  m.doc() = "dlop's native parts: the c10d backend and the offloaded data pipeline";
  dlop::python::bind_errors(m);
  dlop::python::bind_backend(m);
  dlop::python::bind_media(m);
  dlop::python::bind_image(m);
  m.def_submodule("offload", "the trainer side of offloading: epoch plans, leases, pacing");
  // LeaseManager's pacer argument needs DataPacer bound first.
  dlop::python::bind_data_pacer(m);
  dlop::python::bind_offload_loader(m);
  m.def("_trace_flush", &dlop::trace::flush, "writes DLOP_TRACE's file now (benchmarks read it in the same process)");
}
