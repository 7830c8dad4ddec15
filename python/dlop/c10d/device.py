"""How accelerator tensors travel (DLOP_DEVICE_BACKEND), read when a group is made.

``auto`` (the default) compares the devices the ranks of the group use (by
UUID where torch reports one):
  - each rank on a device of its own (its current one when the group is
    made), and the accelerator has a native backend (NCCL on CUDA, XCCL on
    XPU): dlop hands that backend the calls on the device's tensors;
  - every rank on one and the same device (which NCCL refuses), compared at
    the group's first all-reduce on a device: all-reduces reduce in that
    device's memory (python/dlop/c10d/shared_device.py); the other calls, and
    every call where the memory cannot be shared, are staged;
  - otherwise dlop stages them through pinned host memory.
The choice is logged at info level (DLOP_LOG_LEVEL=info). ``staged``: always
stage. ``shared``: reduce in the shared device's memory, and refuse every
all-reduce on a device the ranks do not share. Any other value names the backend to
delegate to, for the device types it serves (``gloo``: CPU tensors, a test
setting); accelerator tensors it does not serve are then refused.

The delegate is made here, in Python, for the same store, ranks and timeout,
so that dlop itself needs no device library's headers. The engine still
counts each delegated call as gradient traffic for its data credits. Its keys
go under the dlop group's namespace of this attempt (``pg.store_namespace``),
so that a restarted job never reads what an earlier attempt left in the store.
"""

from __future__ import annotations

import os
import socket

ENV = "DLOP_DEVICE_BACKEND"
# The native backend of each accelerator that has one.
NATIVE = {"cuda": "nccl", "xpu": "xccl"}


def choice() -> str:
    return os.environ.get(ENV, "auto").strip().lower() or "auto"


def _native() -> tuple[str, str] | None:
    """(device type, backend) of this machine's accelerator, if it has a native backend."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cuda", "nccl"
    if hasattr(torch, "xpu") and torch.xpu.is_available() and getattr(dist, "is_xccl_available", lambda: False)():
        return "xpu", "xccl"
    return None


def _device_in_use(device_type: str, index: int | None = None) -> str:
    """The device this rank uses (its current one, or `index`), as "host device" naming the physical device.

    The device's UUID where torch reports one, so that ranks each shown a different
    device as index 0 (CUDA_VISIBLE_DEVICES) count as apart; else its index on the host.
    """
    import torch

    module = torch.get_device_module(device_type)
    if index is None:
        index = module.current_device()
    uuid = getattr(module.get_device_properties(index), "uuid", None) if hasattr(module, "get_device_properties") else None
    return f"{socket.gethostname()} {uuid if uuid is not None else f'{device_type}:{index}'}"


def _accelerator() -> str | None:
    """The device type of this machine's accelerator, if any (dlop_test counts)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        return None
    return accelerator.current_accelerator().type


def _devices_of_ranks(store, key: str, rank: int, size: int, device_type: str, index: int | None = None) -> list[str]:
    """Each rank's device (its current one, or `index`); every rank reads the same list."""
    store.set(f"{key}/{rank}", _device_in_use(device_type) if index is None else _device_in_use(device_type, index))
    return [store.get(f"{key}/{r}").decode() for r in range(size)]


def _each_rank_has_own_device(store, rank: int, size: int, device_type: str) -> bool:
    """Whether no two ranks of the group use the same device; every rank answers the same."""
    return len(set(_devices_of_ranks(store, "dlop-devices", rank, size, device_type))) == size


def _log(namespace: str, level: str, message: str) -> None:
    from dlop import _C

    _C._log(level, f"dlop group {namespace}: {message}")


def _sharer(namespace: str, store, rank: int, size: int, required: bool):
    """What the group asks at its first all-reduce on a device: every rank's memory there, or why it stages."""

    asked = [0]  # every rank asks at the same calls: the count keeps each round's keys apart

    def share(device_name: str):
        import torch

        from dlop.c10d import shared_device

        device = torch.device(device_name)
        asked[0] += 1
        key = f"dlop-shared-device/{asked[0]}"
        devices = _devices_of_ranks(store, f"{key}/devices", rank, size, device.type, device.index)
        level = "info"  # ranks on devices of their own stage as designed; memory that cannot be shared is worth a warning
        if len(set(devices)) != 1:
            why = f"the ranks use different devices ({', '.join(sorted(set(devices)))})"
        else:
            level = "warn"
            answer = shared_device.exchange(store, key, rank, size, device)
            if not isinstance(answer, str):
                _log(namespace, "info", f"ranks share {device}: all-reduces reduce in its memory, other calls are staged")
                return answer
            why = answer
        if required:
            raise RuntimeError(f"{ENV}=shared: {why}")
        _log(namespace, level, f"calls on {device} are staged: {why}")
        return why

    return share


def _make(name: str, store, dist_options):
    """A backend `name` for the group of dist_options, on its own keys of the group's store."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"dlop-delegate-{name}/", store)
    rank, size, timeout = dist_options.group_rank, dist_options.group_size, dist_options.timeout
    if name == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, size, timeout)
    if name in ("nccl", "xccl"):
        cls = dist.ProcessGroupNCCL if name == "nccl" else dist.ProcessGroupXCCL
        options = cls.Options()
        options._timeout = timeout
        options.global_ranks_in_group = list(dist_options.global_ranks_in_group)
        options.group_name = f"{dist_options.group_id}:dlop-delegate"
        return cls(prefixed, rank, size, options)
    plugin = dist.Backend._plugins.get(name.upper())
    if plugin is None or name == "dlop":
        raise ValueError(f"{ENV}={name!r}: not a torch.distributed backend (use auto, staged, shared, nccl, gloo, ...)")
    opts = dist.distributed_c10d._DistributedBackendOptions()
    opts.store, opts.group_rank, opts.group_size, opts.timeout = prefixed, rank, size, timeout
    opts.group_id, opts.global_ranks_in_group = dist_options.group_id, dist_options.global_ranks_in_group
    return plugin.creator_fn(opts, None) if plugin.extended_api else plugin.creator_fn(prefixed, rank, size, timeout)


def attach_device_backend(pg, dist_options) -> None:
    """Gives `pg` (a dlop._C.ProcessGroupDlop) its delegate, or its device sharer, as DLOP_DEVICE_BACKEND says."""
    import torch.distributed as dist

    name = choice()
    if name == "staged":
        return
    store = dist.PrefixStore(pg.store_namespace + "/", dist_options.store)
    rank, size = dist_options.group_rank, dist_options.group_size
    if name in ("auto", "shared"):
        device_type = _accelerator()
        if device_type is None or size == 1:
            if name == "shared":
                raise RuntimeError(f"{ENV}=shared: " + ("no accelerator" if device_type is None else "a group of one rank"))
            return
        native = _native()
        if name == "auto" and native is not None and native[0] == device_type:
            if _each_rank_has_own_device(store, rank, size, device_type):
                pg.set_device_backend(_make(native[1], store, dist_options), native[1], [device_type], True)
                _log(pg.store_namespace, "info", f"each rank has a {device_type} device of its own: {native[1]} serves them")
                return
        pg.share_device_when_used(_sharer(pg.store_namespace, store, rank, size, required=name == "shared"))
        return
    served = dist.Backend.backend_capability.get(name)
    if served is None:
        raise ValueError(f"{ENV}={name!r}: not a torch.distributed backend (use auto, staged, shared, nccl, gloo, ...)")
    pg.set_device_backend(_make(name, store, dist_options), name, list(served), False)
