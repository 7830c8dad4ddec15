"""import_torchvision(): torchvision, also where its compiled operators do not load.

PyPI's torchvision wheel is built against PyPI's CUDA torch. Next to a CPU
build of torch its C++ operators fail to load, and ``import torchvision`` then
dies registering fake kernels for two of them (``torchvision::nms`` and
``qnms``). dlop needs only torchvision's datasets and transforms, which are
Python on top of torch: declaring those two schemas lets the import finish.
Anything that does need the compiled operators still fails, with torch's error.
"""

from __future__ import annotations

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
