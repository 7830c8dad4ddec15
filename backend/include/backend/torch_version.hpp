// The torch version the backend is compiled against, for the few places where
// torch's c10d headers differ between the versions dlop supports (2.4 on).
// Prefer code that works on every version (a requires-expression on an
// options struct, say); use DLOP_TORCH_AT_LEAST where a declaration itself
// differs, such as an `override` of a virtual older torch does not have.
// scripts/check_torch_compat.sh compiles the backend against an older torch.
#pragma once

#include <torch/version.h>  // torch/csrc/api/include (cmake/DlopTorch.cmake passes it)

#define DLOP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
