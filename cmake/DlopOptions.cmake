# Compile options for dlop's own targets: warnings are errors, sanitizers on demand.
# DLOP_WARNINGS_AS_ERRORS is off only where third-party headers from another
# distribution meet a newer compiler that warns inside them (scripts/gpu_check.sh).
option(DLOP_WARNINGS_AS_ERRORS "Compile dlop's own code with -Werror" ON)
add_library(dlop_options INTERFACE)
target_compile_options(dlop_options INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
  -Wcast-align -Wunused -Woverloaded-virtual
  -Wimplicit-fallthrough $<$<BOOL:${DLOP_WARNINGS_AS_ERRORS}>:-Werror>
  # Designated initializers may leave members to their defaults on purpose.
  -Wno-missing-field-initializers)
if(DLOP_SANITIZE)
  target_compile_options(dlop_options INTERFACE -fsanitize=${DLOP_SANITIZE} -fno-omit-frame-pointer)
  # -O1 after CMake's -O2, as ASan's docs advise: GCC compiles ASan+UBSan code
  # in half the time (the build was most of CI's), and TSan code (the engine's
  # libraries and tests, about 75 files) in three quarters of it.
  target_compile_options(dlop_options INTERFACE $<$<CONFIG:RelWithDebInfo,Release>:-O1>)
  target_link_options(dlop_options INTERFACE -fsanitize=${DLOP_SANITIZE})
endif()

# RelWithDebInfo keeps line tables only (-g1, after CMake's -g): backtraces,
# sanitizer reports and perf keep function, file and line, and each file that
# includes torch's headers compiles in 60% of the time full debug information
# takes. A debugger session wants DLOP_FULL_DEBUG_INFO=ON or a Debug build.
option(DLOP_FULL_DEBUG_INFO "Full debug information (-g) in RelWithDebInfo builds" OFF)
if(NOT DLOP_FULL_DEBUG_INFO)
  target_compile_options(dlop_options INTERFACE $<$<CONFIG:RelWithDebInfo>:-g1>)
endif()

# Headers most of dlop's files include, compiled once per target instead of
# once per file: parsing them was a third of a typical file's compile time.
# Files built with their own code-generation flags (-O3, -mavx2) cannot use a
# PCH built without them and skip it.
function(dlop_precompile_common_headers target)
  target_precompile_headers(${target} PRIVATE <fmt/format.h> <algorithm> <chrono> <cstdint> <cstring> <functional>
                            <memory> <optional> <string> <string_view> <vector>)
endfunction()

# Test and benchmark executables compile their files in batches of eight, one
# translation unit per batch: each file is short and mostly GoogleTest, fmt and
# the layer's headers, which a batch then parses once. A target whose files
# define file-local helpers under the same names turns it off (UNITY_BUILD OFF
# after this), or marks such a file SKIP_UNITY_BUILD_INCLUSION.
function(dlop_unity_build target)
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
endfunction()
