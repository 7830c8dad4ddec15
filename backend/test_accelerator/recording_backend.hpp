#pragma once

#include <pybind11/pybind11.h>

namespace dlop::test_accelerator {

// dlop.testing._accelerator.RecordingBackend (recording_backend.cpp).
void bind_recording_backend(pybind11::module_& m);

}  // namespace dlop::test_accelerator
