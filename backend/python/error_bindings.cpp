// dlop's exceptions in Python: a dlop::Error (or the torch exception it became
// on its way through c10d, backend::ErrorCode) is raised as the class
// python/dlop/errors.py maps its code to. The translator is global, so it also
// serves exceptions that leave torch's own bindings (dist.all_reduce,
// Work.wait, Future.wait) when they came from dlop.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "backend/torch_error.hpp"
#include "bindings.hpp"
#include "core/error.hpp"
#include "media/image.hpp"
#include "offload/lease_manager.hpp"

namespace py = pybind11;

namespace dlop::python {
namespace {

py::module_ errors_module() { return py::module_::import("dlop.errors"); }

void set_python_error(const py::object& cls, const char* message) { PyErr_SetString(cls.ptr(), message); }

void set_python_error(Errc code, const char* message) {
  set_python_error(errors_module().attr("_BY_CODE")[py::str(std::string(errc_name(code)))], message);
}

void translate(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const media::SampleError& e) {
    set_python_error(errors_module().attr("SampleError"), e.what());
  } catch (const offload::BatchSampleError& e) {
    set_python_error(errors_module().attr("SampleError"), e.what());
  } catch (const offload::NoOffloaderError& e) {
    set_python_error(errors_module().attr("NoOffloaderError"), e.what());
  } catch (const Error& e) {
    set_python_error(e.code(), e.what());
  } catch (const backend::ErrorCode& e) {
    set_python_error(e.code(), dynamic_cast<const c10::Error&>(e).what_without_backtrace());
  }
  // Anything else leaves this function and goes to the next translator (torch's, pybind11's).
}

// Every code's name, in the enum's order: a test checks each has a class.
std::vector<std::string> errc_names() {
  std::vector<std::string> names;
  for (int i = 0;; ++i) {
    const auto name = errc_name(static_cast<Errc>(i));
    if (name == errc_name(static_cast<Errc>(-1))) return names;
    names.emplace_back(name);
  }
}

}  // namespace

void bind_errors(py::module_& m) {
  py::register_exception_translator(translate);
  m.def("_errc_names", errc_names, "every dlop::Errc's name (see dlop.errors._BY_CODE)");
  m.def(
      "_raise_error",
      [](const std::string& code, const std::string& message) {
        for (int i = 0; i < static_cast<int>(errc_names().size()); ++i) {
          if (errc_name(static_cast<Errc>(i)) == code) throw_error(static_cast<Errc>(i), message);
        }
        throw_error(Errc::kInvalidArgument, "no error code named '" + code + "'");
      },
      py::arg("code"), py::arg("message"), "throws a dlop::Error of that code from C++ (for tests)");
}

}  // namespace dlop::python
