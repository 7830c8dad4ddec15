# Finds the torch installed for Python_EXECUTABLE (the venv's, or the
# interpreter pip builds with) without TorchConfig.cmake, which would also probe
# CUDA toolkits we do not use here. Defines the imported target dlop::torch with
# torch's headers, its libraries (libtorch_python included, which TorchConfig
# does not export) and the ABI flags the extension must share with torch's own
# pybind11 module, or importing it crashes.
find_package(Python COMPONENTS Interpreter Development.Module)
set(DLOP_HAVE_TORCH OFF)
if(NOT Python_FOUND)
  message(STATUS "dlop: no Python interpreter with development headers: the extension dlop._C is off")
  return()
endif()

execute_process(
  COMMAND ${Python_EXECUTABLE} -c [=[
import torch, torch.utils.cpp_extension as ext
print("DLOP_TORCH_VERSION=" + torch.__version__.split("+")[0])
print("DLOP_TORCH_INCLUDES=" + "|".join(ext.include_paths()))
print("DLOP_TORCH_LIBDIR=" + ext.library_paths()[0])
print("DLOP_TORCH_CXX11_ABI=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))
for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
    value = getattr(torch._C, "_PYBIND11_" + name, None)
    if value is not None:
        print("DLOP_TORCH_PYBIND11_" + name + "=" + value)
]=]
  OUTPUT_VARIABLE _dlop_torch_out
  ERROR_VARIABLE _dlop_torch_err
  RESULT_VARIABLE _dlop_torch_rc)
if(NOT _dlop_torch_rc EQUAL 0)
  message(STATUS "dlop: torch not importable by ${Python_EXECUTABLE}: the extension dlop._C is off")
  return()
endif()
string(REPLACE "\n" ";" _dlop_torch_lines "${_dlop_torch_out}")
foreach(_line IN LISTS _dlop_torch_lines)
  if(_line MATCHES "^([A-Z0-9_]+)=(.*)$")
    set(${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
  endif()
endforeach()
# Joined with "|" above: a ";" would have split the line itself into list items,
# leaving only the first folder (torch/include, without torch/csrc/api/include,
# where <torch/version.h> lives).
string(REPLACE "|" ";" DLOP_TORCH_INCLUDES "${DLOP_TORCH_INCLUDES}")

# PyPI's wheels of torch < 2.7 use the pre-C++11 libstdc++ ABI. The extension
# must share torch's ABI, but dlop's other libraries and Debian's fmt and
# spdlog use the C++11 one: every std::string across that boundary would be
# an undefined symbol when dlop._C is imported. (The headers of torch 2.4 on
# do compile: scripts/check_torch_compat.sh.)
if(DLOP_TORCH_CXX11_ABI STREQUAL "0")
  message(WARNING "dlop: torch ${DLOP_TORCH_VERSION} was built with the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0, "
                  "as PyPI's wheels of torch < 2.7 are), which dlop's libraries and Debian's fmt/spdlog do not use: "
                  "the extension dlop._C is off. Use torch >= 2.7 from PyPI, or a C++11-ABI build of an older torch.")
  return()
endif()

add_library(dlop::torch INTERFACE IMPORTED)
# -idirafter: torch's include folder also carries its own copies of fmt and
# other libraries; the Debian ones our code and spdlog are built with must win.
foreach(_dir IN LISTS DLOP_TORCH_INCLUDES)
  target_compile_options(dlop::torch INTERFACE "SHELL:-idirafter ${_dir}")
endforeach()
foreach(_lib c10 torch_cpu torch torch_python)
  target_link_libraries(dlop::torch INTERFACE ${DLOP_TORCH_LIBDIR}/lib${_lib}.so)
endforeach()
target_compile_definitions(dlop::torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${DLOP_TORCH_CXX11_ABI})
foreach(_name COMPILER_TYPE STDLIB BUILD_ABI)
  if(DEFINED DLOP_TORCH_PYBIND11_${_name})
    target_compile_definitions(dlop::torch INTERFACE PYBIND11_${_name}="${DLOP_TORCH_PYBIND11_${_name}}")
  endif()
endforeach()
set(DLOP_HAVE_TORCH ON)
message(STATUS "dlop: torch ${DLOP_TORCH_VERSION} found: building the extension dlop._C")
