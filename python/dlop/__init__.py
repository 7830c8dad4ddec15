"""dlop: a collective-communication accelerator for PyTorch over UCX.

A ``torch.distributed`` backend ("dlop") whose collectives run on UCX, and an
offloaded data loader. The compiled part, ``dlop._C``, comes later; for now
this package only carries its version.
"""

# Keep in step with pyproject.toml and project() in CMakeLists.txt
# (tests/python/test_package.py checks all three).
__version__ = "0.1.0"

__all__ = ["__version__"]
