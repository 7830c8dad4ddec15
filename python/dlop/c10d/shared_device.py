"""Ranks that share one accelerator reduce in its memory (backend/src/shared_device.hpp).

At a group's first all-reduce on a device, if every rank uses that same
device, each rank allocates one buffer of two slots of
``DLOP_SHARED_DEVICE_BYTES`` (default 16 MiB) on the device and publishes a
handle to it in the store; every rank then maps every other rank's. CUDA (and
ROCm) memory is shared by torch's own tensor sharing
(``torch.multiprocessing.reductions``), which needs no CUDA headers here;
``dlop_test`` memory by its shared-memory handles. Every rank tells the others
whether it could open them all, and the group reduces in device memory only
where every rank could: otherwise every rank stages, as before, and the reason
is logged.
"""

from __future__ import annotations

import os
import pickle

ENV = "DLOP_SHARED_DEVICE_BYTES"
DEFAULT_SLOT_BYTES = 16 << 20


def slot_bytes() -> int:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_SLOT_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1024:
        raise ValueError(f"{ENV}={raw!r}: expected a number of bytes, at least 1024")
    return value - value % 256  # every slot starts aligned for any dtype


def _allocate(device, nbytes: int):
    """(this rank's buffer, the handle other processes open it by, pickled)."""
    import torch

    if device.type == "dlop_test":  # its module is torch.dlop_test, registered when it was imported
        tensor, handle = torch.get_device_module("dlop_test").empty_shared(nbytes, device)
        return tensor, pickle.dumps(("dlop_test", handle))
    if device.type == "cuda":
        from torch.multiprocessing.reductions import reduce_tensor

        tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return tensor, pickle.dumps(("cuda", reduce_tensor(tensor)))
    raise RuntimeError(f"no way to share {device.type} memory between processes")


def _open(payload: bytes, device, nbytes: int):
    kind, handle = pickle.loads(payload)
    if kind == "dlop_test":
        import torch

        return torch.get_device_module("dlop_test").open_shared(handle, nbytes, device)
    rebuild, args = handle
    tensor = rebuild(*args)
    if tensor.device != device or tensor.numel() < nbytes:
        raise RuntimeError(f"a peer's memory opened as {tensor.numel()} bytes on {tensor.device}, not on {device}")
    return tensor


def exchange(store, key: str, rank: int, size: int, device) -> tuple[list, int] | str:
    """(every rank's buffer, slot bytes), or why every rank stages instead.

    Collective: every rank of the group calls it, with the same `key` (under
    which its store keys go), and every rank gets the same kind of answer.
    """
    slot = slot_bytes()
    nbytes = 2 * slot
    mine = payload = None
    error = None
    try:
        mine, payload = _allocate(device, nbytes)
    except Exception as e:  # noqa: BLE001 (any failure means staging, said below)
        error = f"rank {rank} could not allocate {nbytes} shareable bytes on {device}: {e}"
    store.set(f"{key}/{rank}", payload if payload is not None else b"")
    slabs = []
    for r in range(size):
        if r == rank:
            slabs.append(mine)
            continue
        theirs = store.get(f"{key}/{r}")
        if error is None and theirs:
            try:
                slabs.append(_open(theirs, device, nbytes))
            except Exception as e:  # noqa: BLE001
                error = f"rank {rank} could not open rank {r}'s memory on {device}: {e}"
        elif error is None:
            error = f"rank {r} has no shareable memory on {device}"
    store.set(f"{key}/opened/{rank}", error or "")
    errors = [store.get(f"{key}/opened/{r}").decode() for r in range(size)]
    errors = [e for e in errors if e]
    return errors[0] if errors else (slabs, slot)
