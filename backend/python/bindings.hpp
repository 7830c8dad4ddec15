// The parts of the dlop._C extension module, one function per area, so that
// each area's bindings live beside nothing else.
#pragma once

#include <pybind11/pybind11.h>

namespace dlop::python {

void bind_errors(pybind11::module_& m);  // dlop::Error -> dlop.errors classes (error_bindings.cpp); first
void bind_backend(pybind11::module_& m);  // ProcessGroupDlop and its Work (backend_bindings.cpp)
void bind_media(pybind11::module_& m);  // _C.media: sources, pack, batch makers, audio steps (media_bindings.cpp)
void bind_image(pybind11::module_& m);  // _C.media's decode, ops, ImagePipeline (image_bindings.cpp); after bind_media
void bind_offload_loader(pybind11::module_& m);  // _C.offload's EpochPlan, LeaseManager (offload_loader_bindings.cpp); after bind_data_pacer
void bind_data_pacer(pybind11::module_& m);  // _C.offload's DataPacer, engine_pacer (data_pacer_bindings.cpp)

}  // namespace dlop::python
