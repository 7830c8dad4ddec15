"""dlop: a collective-communication accelerator for PyTorch over UCX.

``import dlop`` registers the ``torch.distributed`` backend ``"dlop"`` (CPU
and accelerator tensors). Scripts that never import dlop still find it: torch loads it through
the entry points it reads (see pyproject.toml), so ``--dist-backend dlop`` is
all an unmodified script needs once the package is installed. The ``dlop``
command itself does not import torch: there, the backend loads when
``dlop.init`` or an error class is first asked for.

Under ``mpirun`` or SLURM without torchrun, :func:`dlop.init` reads the
launcher's rank and size and initialises the default process group.
"""

# Keep in step with pyproject.toml and project() in CMakeLists.txt
# (tests/python/test_package.py checks all three).
__version__ = "0.1.0"

import os as _os
import sys as _sys

from dlop import _moved

_moved.install()  # old module paths (dlop.scaling, dlop.run, ...: see _moved.py) keep importing, with a warning, for one release

_BACKEND_NAMES = ("init", "register_backend", "register_device")


def _load_backend() -> None:
    """Imports torch, registers the backend, and binds the backend's functions and dlop's errors here."""
    from dlop import errors
    from dlop.c10d import backend

    backend.register_backend()
    globals().update({name: getattr(backend, name) for name in _BACKEND_NAMES})
    globals().update({name: getattr(errors, name) for name in errors.__all__})


def _is_the_dlop_command() -> bool:
    """Whether this process is the `dlop` command (its console script is __main__). It parses arguments and
    starts other programs: it needs neither torch nor the backend, and importing torch first would add seconds
    to every `dlop run` (the command it execs imports dlop itself)."""
    main = _sys.modules.get("__main__")
    return _os.path.basename(getattr(main, "__file__", None) or "") == "dlop"


if _is_the_dlop_command():
    def __getattr__(name: str):
        # Only the backend's functions and the errors (classes: capitalised) load it. Anything else
        # may be a submodule (`from dlop import fleet`), which the import system then imports itself.
        if name in _BACKEND_NAMES or name[:1].isupper():
            _load_backend()
            if name in globals():
                return globals()[name]
        raise AttributeError(f"module 'dlop' has no attribute {name!r}")
else:
    _load_backend()

__all__ = ["__version__", *_BACKEND_NAMES]
