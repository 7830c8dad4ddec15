"""dlop.data.offload(loader): an existing DataLoader's work, offloaded.

Only what the native pipeline covers is mapped: a torchvision ``ImageFolder``
whose transform is a ``Compose`` of RandomResizedCrop, Resize, CenterCrop,
RandomHorizontalFlip, ToTensor / PILToTensor and a final Normalize. Anything
else raises, saying so: the generic Python path (the dataset run in worker
processes the offloader starts) is not built yet.
"""

from __future__ import annotations

from typing import Any

from dlop.data.offload_loader import OffloadLoader

_GENERIC = "the generic Python path (running an arbitrary dataset on the offloaders) is not built yet"


def _size(value: Any) -> Any:
    if isinstance(value, int):
        return value
    seq = list(value)
    return seq[0] if len(seq) == 1 else seq


def transform_spec(transform: Any) -> dict:
    """A torchvision transform -> a native transform spec, or ValueError naming what does not map."""
    import torchvision.transforms as T

    steps = list(transform.transforms) if isinstance(transform, T.Compose) else [transform]
    ops: list[dict] = []
    output = None
    for t in steps:
        if isinstance(t, T.RandomResizedCrop):
            ops.append({"op": "random_resized_crop", "size": _size(t.size), "scale": list(t.scale),
                        "ratio": list(t.ratio), "antialias": t.antialias is not False})
        elif isinstance(t, T.Resize):
            if t.max_size is not None and not isinstance(t.size, int) and len(t.size) != 1:
                raise ValueError("Resize with max_size needs an int size")
            op = {"op": "resize", "size": _size(t.size), "antialias": t.antialias is not False}
            if t.max_size:
                op["max_size"] = t.max_size
            ops.append(op)
        elif isinstance(t, T.CenterCrop):
            ops.append({"op": "center_crop", "size": _size(t.size)})
        elif isinstance(t, T.RandomHorizontalFlip):
            ops.append({"op": "hflip", "p": float(t.p)})
        elif isinstance(t, T.ToTensor):
            output = "float32"
        elif isinstance(t, T.PILToTensor):
            output = "uint8"
        elif isinstance(t, T.Normalize) and output == "float32":
            ops.append({"op": "normalize", "mean": [float(v) for v in t.mean], "std": [float(v) for v in t.std]})
        else:
            raise ValueError(f"dlop.data.offload: {type(t).__name__} has no native op, and {_GENERIC}")
    if output is None:
        raise ValueError(f"dlop.data.offload: the transform must end in a tensor (ToTensor or PILToTensor); {_GENERIC}")
    return {"ops": ops, "output": output}


def offload(loader: Any, offloaders=(), token: str | None = None, seed: int = 0, **kwargs: Any) -> OffloadLoader:
    """An OffloadLoader making the batches `loader` (a torch DataLoader over an ImageFolder) would.

    Batch size, drop_last and shuffling (a RandomSampler) are taken from the
    DataLoader; the order is dlop's seeded one, not torch's generator's.
    """
    from torch.utils.data import RandomSampler
    from torchvision.datasets import ImageFolder

    dataset = loader.dataset
    if type(dataset) is not ImageFolder:
        raise ValueError(f"dlop.data.offload: the dataset is a {type(dataset).__name__}, not an ImageFolder; {_GENERIC}")
    if dataset.target_transform is not None:
        raise ValueError(f"dlop.data.offload: target_transform is not supported natively; {_GENERIC}")
    if loader.batch_size is None:
        raise ValueError("dlop.data.offload: the DataLoader must batch (batch_size is None)")
    return OffloadLoader(dataset.root, transform_spec(dataset.transform), loader.batch_size,
                         shuffle=isinstance(loader.sampler, RandomSampler), seed=seed, offloaders=offloaders,
                         token=token, drop_last=loader.drop_last, **kwargs)
