"""The generic Python path: a picklable Dataset + collate_fn run by an
offloader's worker processes (or locally, in the fallback).

Three things live here because the trainer, the daemon's workers and the
local fallback must agree on them byte for byte:
- the job: (dataset, collate_fn, sys.path) pickled, by cloudpickle when it is
  installed (classes defined in a script's __main__ then travel by value);
- a batch: ``collate([dataset[i] for i in indices])`` under random state
  seeded from (seed, epoch, indices), so a batch is identical whichever
  worker, daemon or fallback made it; a sample that raises fails the batch
  with dlop.SampleError, or is left out under the skip policy, and the blob
  carries the skipped indices beside the batch;
- the batch blob: the collate output pickled with every tensor and numpy
  array replaced by a reference to its bytes, which follow at 64-byte aligned
  offsets. ``decode_batch`` rebuilds the structure with tensors that are
  views of the received buffer, so nothing is copied on the trainer.
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import struct
import sys
from typing import Any, Callable

import numpy as np
import torch

_MAGIC = b"DLPB"
_VERSION = 1
_ALIGN = 64
_HEAD = struct.Struct("<4sIQQ")  # magic, version, skeleton bytes, tensor count
_TENSOR = struct.Struct("<QQQI")  # offset, bytes, elements, rank (then the dims, u64 each)


def _pickle_module():
    try:
        import cloudpickle  # type: ignore[import-not-found]
        return cloudpickle
    except ImportError:
        return pickle


def encode_job(dataset: Any, collate_fn: Callable | None, skip: bool = False) -> bytes:
    """The CONFIGURE payload; raises ValueError naming what does not pickle. ``skip``: a sample
    the dataset cannot make is left out of its batch instead of failing it."""
    try:
        inner = _pickle_module().dumps((dataset, collate_fn), protocol=pickle.HIGHEST_PROTOCOL)
        # The import path travels outside, so it is in place before the
        # dataset's modules are looked up; PIL's process-wide switch travels
        # too, so a worker reads truncated images as the trainer's PIL would.
        return pickle.dumps((list(sys.path), inner, {"skip": bool(skip), "load_truncated_images": _pil_truncated()}),
                            protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # pickling raises many kinds
        raise ValueError(f"the dataset or collate_fn cannot be pickled for the offloaders: {e}") from e


def _pil_truncated() -> bool:
    """PIL.ImageFile.LOAD_TRUNCATED_IMAGES here (False when PIL was never imported)."""
    image_file = sys.modules.get("PIL.ImageFile")
    return bool(getattr(image_file, "LOAD_TRUNCATED_IMAGES", False))


def load_job(blob: bytes) -> tuple[Any, Callable, bool]:
    """(dataset, collate_fn, skip) from encode_job's bytes; None means torch's default_collate."""
    # The trainer's modules are found through its import path; a daemon on
    # another host needs the same code at the same place, as any worker would.
    path, inner, options = pickle.loads(blob)
    for p in path:
        if p not in sys.path:
            sys.path.append(p)
    if options["load_truncated_images"]:
        from PIL import ImageFile

        ImageFile.LOAD_TRUNCATED_IMAGES = True
    dataset, collate_fn = pickle.loads(inner)
    if collate_fn is None:
        from torch.utils.data import default_collate
        collate_fn = default_collate
    return dataset, collate_fn, options["skip"]


def batch_seed(seed: int, epoch: int, indices) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<QQ", seed & (2**64 - 1), epoch))
    h.update(np.asarray(indices, dtype=np.uint64).tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def sample_name(dataset: Any, index: int) -> str:
    """Sample `index` as an error names it: its file where the dataset lists them (torchvision's
    DatasetFolder ``samples``, ``imgs``), else its index."""
    for attr in ("samples", "imgs"):
        listed = getattr(dataset, attr, None)
        try:
            entry = listed[index] if listed is not None else None
            path = entry[0] if isinstance(entry, (tuple, list)) else entry
            if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__"):
                return f"{index} ({os.fsdecode(path)})"
        except Exception:  # a listing of another shape names nothing
            pass
    return str(index)


def make_batch(dataset: Any, collate_fn: Callable, seed: int, epoch: int, indices,
               skip: bool = False) -> tuple[Any, list[tuple[int, str]]]:
    """(the collated batch, [(index, reason) skipped]). A sample the dataset cannot make raises
    dlop.SampleError naming it and why, or with ``skip`` is left out (the batch is None when no
    sample is left). The random state is seeded from (seed, epoch, indices) before the first
    sample, so a batch is the same wherever it is made, skipped samples included."""
    from dlop.errors import SampleError

    s = batch_seed(seed, epoch, indices)
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)
    samples, skipped = [], []
    for i in indices:
        try:
            samples.append(dataset[int(i)])
        except Exception as e:  # whatever the dataset raises is this sample's failure
            reason = f"sample {sample_name(dataset, int(i))}: {type(e).__name__}: {e}"
            if not skip:
                raise SampleError(reason) from e
            skipped.append((int(i), reason))
    return (collate_fn(samples) if samples else None), skipped


def encode_batch(obj: Any) -> bytes:
    """The blob for one collated batch (see the module's docstring)."""
    return b"".join(encode_batch_parts(obj))


def encode_batch_parts(obj: Any) -> list:
    """The blob as a list of buffers to write one after the other (the
    tensors' own memory among them, so a socket can take them uncopied)."""
    tensors: list[torch.Tensor] = []

    class _Pickler(pickle.Pickler):
        def persistent_id(self, o):
            if isinstance(o, np.ndarray) and o.dtype != object:
                tensors.append(torch.from_numpy(np.ascontiguousarray(o)))
                return ("np", len(tensors) - 1, o.dtype.str)
            if isinstance(o, torch.Tensor):
                if o.layout != torch.strided or o.is_quantized or o.requires_grad:
                    raise ValueError(f"a batch holds a tensor dlop cannot send (layout {o.layout}, "
                                     f"requires_grad {o.requires_grad}): make the collate_fn return plain ones")
                tensors.append(o.detach().cpu().contiguous())
                return ("t", len(tensors) - 1, str(o.dtype).removeprefix("torch."))
            return None

    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    skeleton = buf.getvalue()
    head_end = _HEAD.size + len(skeleton) + sum(_TENSOR.size + 8 * t.dim() for t in tensors)
    table = bytearray()
    offset = _align(head_end)
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        table += _TENSOR.pack(offset, nbytes, t.numel(), t.dim()) + struct.pack(f"<{t.dim()}Q", *t.shape)
        offset = _align(offset + nbytes)
    parts: list = [_HEAD.pack(_MAGIC, _VERSION, len(skeleton), len(tensors)), skeleton, bytes(table)]
    at = head_end
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        parts.append(bytes(_align(at) - at))
        at = _align(at)
        if nbytes:
            parts.append(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        at += nbytes
    parts.append(bytes(_align(at) - at))
    return parts


def decode_batch(buffer) -> Any:
    """Rebuilds a batch; its tensors are views of `buffer` (writable bytes)."""
    view = memoryview(buffer).cast("B")
    if len(view) < _HEAD.size:
        raise ValueError(f"batch blob of {len(view)} bytes is shorter than its header")
    magic, version, skeleton_bytes, count = _HEAD.unpack_from(view, 0)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"not a dlop batch blob (magic {magic!r}, version {version})")
    at = _HEAD.size + skeleton_bytes
    skeleton = bytes(view[_HEAD.size:at])
    places = []
    for _ in range(count):
        offset, nbytes, numel, rank = _TENSOR.unpack_from(view, at)
        at += _TENSOR.size
        shape = struct.unpack_from(f"<{rank}Q", view, at)
        at += 8 * rank
        if offset + nbytes > len(view):
            raise ValueError("batch blob: a tensor lies past the end of the buffer")
        places.append((offset, nbytes, numel, shape))

    def tensor(i: int, dtype: torch.dtype) -> torch.Tensor:
        offset, nbytes, numel, shape = places[i]
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(view, dtype=torch.uint8, count=nbytes, offset=offset)
        return flat.view(dtype).view(shape)

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid):
            if pid[0] == "np":
                return tensor(pid[1], torch.from_numpy(np.empty(0, dtype=np.dtype(pid[2]))).dtype).numpy()
            dtype = getattr(torch, pid[2], None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"batch blob: unknown tensor dtype {pid[2]!r}")
            return tensor(pid[1], dtype)

    return _Unpickler(io.BytesIO(skeleton)).load()


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN
