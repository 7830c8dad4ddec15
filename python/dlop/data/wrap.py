"""dlop.data.offload(loader): an existing DataLoader's work, offloaded.

A torchvision ``ImageFolder`` of JPEG and PNG files whose transform is a
``Compose`` of RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip,
ToTensor / PILToTensor and a final Normalize, batched by default_collate,
runs on the native pipeline (unless PIL.ImageFile.LOAD_TRUNCATED_IMAGES is
set). Any other map-style dataset and collate_fn that pickle run
on the generic Python path (the daemons' Python workers). The sampler must be
one dlop reproduces either way.
"""

from __future__ import annotations

from typing import Any

from dlop.data.offload_loader import OffloadLoader

_GENERIC = "the native pipeline cannot run it"


def _size(value: Any) -> Any:
    if isinstance(value, int):
        return value
    seq = list(value)
    return seq[0] if len(seq) == 1 else seq


def _resize_params(t: Any) -> dict:
    if t.max_size is not None and not isinstance(t.size, int) and len(t.size) != 1:
        raise ValueError("Resize with max_size needs an int size")
    params = {"size": _size(t.size), "antialias": t.antialias is not False}
    if t.max_size:
        params["max_size"] = t.max_size
    return params


def _torchvision_ops(T: Any) -> list:
    """(torchvision transform class, native op, its parameters from the transform): one line per op that
    mirrors a torchvision transform. The native ops and their parameters are dlop._C.media.transform_ops()."""
    return [
        (T.RandomResizedCrop, "random_resized_crop",
         lambda t: {"size": _size(t.size), "scale": list(t.scale), "ratio": list(t.ratio),
                    "antialias": t.antialias is not False}),
        (T.Resize, "resize", _resize_params),
        (T.CenterCrop, "center_crop", lambda t: {"size": _size(t.size)}),
        (T.RandomHorizontalFlip, "hflip", lambda t: {"p": float(t.p)}),
    ]


def transform_spec(transform: Any) -> dict:
    """A torchvision transform -> a native transform spec, or ValueError naming what does not map."""
    from dlop._torchvision_compat import import_torchvision

    T = import_torchvision().transforms

    steps = list(transform.transforms) if isinstance(transform, T.Compose) else [transform]
    table = _torchvision_ops(T)
    ops: list[dict] = []
    output = None
    for t in steps:
        native = next(((op, params) for cls, op, params in table if isinstance(t, cls)), None)
        if native is not None:
            ops.append({"op": native[0], **native[1](t)})
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


def _rank_world_size() -> int:
    from dlop.data.offload_loader import _rank_world

    return _rank_world()[1]


def _order(loader: Any, seed: int) -> tuple[bool, int, bool]:
    """(shuffle, seed, drop_last) of the loader's sampler, or ValueError for one dlop cannot reproduce."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
    from torch.utils.data.distributed import DistributedSampler

    if type(loader.batch_sampler) is not BatchSampler:
        raise ValueError(f"dlop.data.offload: a custom batch_sampler ({type(loader.batch_sampler).__name__}) "
                         "decides the batches itself")
    sampler = loader.sampler
    if type(sampler) in (RandomSampler, SequentialSampler) and _rank_world_size() > 1:
        raise ValueError("dlop.data.offload: a RandomSampler or SequentialSampler in a job of several ranks "
                         "(each rank would read the whole dataset); dlop shards by rank, as a DistributedSampler")
    if type(sampler) is RandomSampler:
        if sampler.replacement or sampler._num_samples is not None:
            raise ValueError("dlop.data.offload: a RandomSampler with replacement or num_samples")
        return True, seed, loader.drop_last
    if type(sampler) is SequentialSampler:
        return False, seed, loader.drop_last
    if type(sampler) is DistributedSampler:
        from dlop.data.offload_loader import _rank_world

        if (sampler.rank, sampler.num_replicas) != _rank_world():
            raise ValueError(f"dlop.data.offload: the DistributedSampler is rank {sampler.rank} of "
                             f"{sampler.num_replicas}, the process group says {_rank_world()}: dlop shards by the "
                             "process group")
        # dlop's plan shards across the job's ranks by DistributedSampler's
        # rules with one drop_last for the sampler and the last batch.
        if sampler.drop_last != loader.drop_last:
            raise ValueError(f"dlop.data.offload: DistributedSampler(drop_last={sampler.drop_last}) with "
                             f"DataLoader(drop_last={loader.drop_last}): dlop's plan needs the two equal")
        return sampler.shuffle, sampler.seed, loader.drop_last
    raise ValueError(f"dlop.data.offload: the sampler is a {type(sampler).__name__}; dlop reproduces "
                     "RandomSampler, SequentialSampler and DistributedSampler")


# The files the native decoders read, by extension (torchvision's ImageFolder lists more: .bmp, .webp, ...).
_NATIVE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def _native_files(dataset: Any, folder: Any) -> None:
    """ValueError unless the native folder source lists exactly the dataset's samples and decodes them
    as its PIL loader would: torchvision's extensions and loader, JPEG and PNG files only, and PIL
    failing on a truncated image (LOAD_TRUNCATED_IMAGES fills it in, which only PIL does as PIL)."""
    import sys

    if getattr(dataset, "extensions", None) != folder.IMG_EXTENSIONS:
        raise ValueError(f"dlop.data.offload: the ImageFolder picks its files itself (is_valid_file); {_GENERIC}")
    if dataset.loader is not folder.default_loader:
        raise ValueError(f"dlop.data.offload: the ImageFolder has its own loader; {_GENERIC}")
    other = [path for path, _ in dataset.samples if not path.lower().endswith(_NATIVE_EXTENSIONS)]
    if other:
        raise ValueError(f"dlop.data.offload: {len(other)} file(s) are neither JPEG nor PNG ({other[0]}"
                         f"{', ...' if len(other) > 1 else ''}); {_GENERIC}")
    if getattr(sys.modules.get("PIL.ImageFile"), "LOAD_TRUNCATED_IMAGES", False):
        raise ValueError("dlop.data.offload: PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set, and only PIL fills in a "
                         f"truncated image as PIL does; {_GENERIC}")


def native_source(loader: Any) -> tuple[str, dict]:
    """(image folder, transform spec) when the native pipeline reproduces `loader`, else ValueError saying why."""
    from dlop._torchvision_compat import import_torchvision
    from torch.utils.data import default_collate

    ImageFolder = import_torchvision().datasets.ImageFolder
    dataset = loader.dataset
    if type(dataset) is not ImageFolder:
        raise ValueError(f"dlop.data.offload: the dataset is a {type(dataset).__name__}, not an ImageFolder; {_GENERIC}")
    if dataset.target_transform is not None:
        raise ValueError(f"dlop.data.offload: target_transform is not supported natively; {_GENERIC}")
    _native_files(dataset, import_torchvision().datasets.folder)
    if loader.collate_fn is not default_collate:
        raise ValueError(f"dlop.data.offload: a custom collate_fn ({getattr(loader.collate_fn, '__name__', '?')}) "
                         f"has no native equivalent; {_GENERIC}")
    return dataset.root, transform_spec(dataset.transform)


def offload(loader: Any, offloaders=(), token: str | None = None, seed: int = 0, native_only: bool = False,
            **kwargs: Any) -> OffloadLoader:
    """An OffloadLoader making the batches `loader` (a torch DataLoader) would.

    Batch size, drop_last, shuffling and (for a DistributedSampler) its seed
    are taken from the DataLoader; the order is dlop's seeded one, not
    torch's generator's, sharded over the job's ranks. What the native
    pipeline cannot reproduce goes to the generic Python path, unless
    `native_only` (then ValueError says why).
    """
    from torch.utils.data import IterableDataset, default_collate

    if loader.batch_size is None:
        raise ValueError("dlop.data.offload: the DataLoader must batch (batch_size is None)")
    shuffle, seed, drop_last = _order(loader, seed)
    common = dict(shuffle=shuffle, seed=seed, offloaders=offloaders, token=token, drop_last=drop_last, **kwargs)
    try:
        root, spec = native_source(loader)
    except ValueError:
        if native_only:
            raise
        if isinstance(loader.dataset, IterableDataset):
            raise ValueError("dlop.data.offload: an IterableDataset has no indices to lease; dlop offloads "
                             "map-style datasets") from None
        collate = None if loader.collate_fn is default_collate else loader.collate_fn
        return OffloadLoader(dataset=loader.dataset, collate_fn=collate, batch_size=loader.batch_size, **common)
    return OffloadLoader(root, spec, loader.batch_size, **common)
