#include "bindings.hpp"

namespace dlop::python {

void bind_offload(pybind11::module_& /*m*/) {}

}  // namespace dlop::python
