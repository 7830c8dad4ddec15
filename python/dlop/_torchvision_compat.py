"""import_torchvision(): torchvision, also where its compiled operators do not load.

PyPI's torchvision wheel is built against PyPI's CUDA torch. Next to a CPU
build of torch its C++ operators fail to load, and ``import torchvision`` then
dies registering fake kernels for two of them (``torchvision::nms`` and
``qnms``). dlop needs only torchvision's datasets and transforms, which are
Python on top of torch: declaring those two schemas lets the import finish.
Anything that does need the compiled operators still fails, with torch's error.

``import_on_demand()`` puts the same on the first ``import torchvision``
instead, for processes that may never need it (an offloader's Python
workers: importing torchvision is half of their start).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_libraries: list = []  # the declared schemas live as long as the process


def import_torchvision():
    import torch

    try:
        import torchvision
    except RuntimeError:
        if hasattr(torch.ops.torchvision, "nms"):
            raise  # the compiled operators are there: the import failed for another reason
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _libraries.append(lib)
        import torchvision
    return torchvision


class _OnDemand(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The first ``import torchvision`` goes through import_torchvision(), then this steps aside."""

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        import_torchvision()
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return sys.modules["torchvision"]  # import_torchvision() has loaded it

    def exec_module(self, module):
        pass


def import_on_demand() -> None:
    if "torchvision" not in sys.modules and not any(isinstance(f, _OnDemand) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnDemand())
