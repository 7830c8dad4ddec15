"""Runs dlop.bench.c10d with the dlop package from DLOP_BASE (a copy of python/dlop
built at the base revision), or, without it, the checkout's own. Launch under
torchrun with TORCH_DEVICE_BACKEND_AUTOLOAD=0, so that torch imports no dlop first."""

import importlib.util
import os
import runpy
import sys

if os.environ.get("DLOP_BASE"):
    base = os.environ["DLOP_BASE"]
    spec = importlib.util.spec_from_file_location("dlop", os.path.join(base, "__init__.py"),
                                                  submodule_search_locations=[base])
    module = importlib.util.module_from_spec(spec)
    sys.modules["dlop"] = module
    spec.loader.exec_module(module)
import dlop  # noqa: E402

print("# dlop package:", dlop.__file__, flush=True)
sys.argv = ["dlop.bench.c10d"] + sys.argv[1:]
runpy.run_module("dlop.bench.c10d", run_name="__main__", alter_sys=True)
