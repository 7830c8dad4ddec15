// The parts of the dlop._C extension module, one function per area, so that
// each area's bindings live beside nothing else.
#pragma once

#include <pybind11/pybind11.h>

namespace dlop::python {

void bind_errors(pybind11::module_& m);  // dlop::Error -> dlop.errors classes (error_bindings.cpp); first
void bind_backend(pybind11::module_& m);  // ProcessGroupDlop and its Work (backend_bindings.cpp)
void bind_offload(pybind11::module_& m);  // the native data pipeline (offload_bindings.cpp)
void bind_media(pybind11::module_& m);  // batch makers of every kind, audio steps (media_bindings.cpp); after bind_offload
void bind_offload_loader(pybind11::module_& m);  // EpochPlan, LeaseManager (offload_loader_bindings.cpp); after bind_offload
void bind_data_pacer(pybind11::module_& m);  // DataPacer, engine_pacer (data_pacer_bindings.cpp); after bind_offload

}  // namespace dlop::python
