"""dlop: a collective-communication accelerator for PyTorch over UCX.

``import dlop`` registers the ``torch.distributed`` backend ``"dlop"`` (CPU
and accelerator tensors). Scripts that never import dlop still find it: torch loads it through
the entry points it reads (see pyproject.toml), so ``--dist-backend dlop`` is
all an unmodified script needs once the package is installed.

Under ``mpirun`` or SLURM without torchrun, :func:`dlop.init` reads the
launcher's rank and size and initialises the default process group.
"""

# Keep in step with pyproject.toml and project() in CMakeLists.txt
# (tests/python/test_package.py checks all three).
__version__ = "0.1.0"

from dlop._backend import init, register_backend, register_device  # noqa: E402
from dlop.errors import *  # noqa: E402,F403  (dlop.Error, dlop.PeerDeadError, ...)

register_backend()

__all__ = ["__version__", "init", "register_backend", "register_device"]
