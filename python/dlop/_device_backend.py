"""Delegation of accelerator tensors to the device's own backend (DLOP_DEVICE_BACKEND).

``auto`` (the default): where the accelerator has a native backend (NCCL on
CUDA, XCCL on XPU) and the ranks of the group each use a device of their own
(their current devices when the group is made, compared by UUID), dlop hands
it the calls on that device's tensors; where ranks use the same device (which
NCCL refuses) or there is no native backend, dlop stages them through pinned
host memory. ``staged``: always stage. Any other value names the backend to
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


def _device_in_use(device_type: str) -> str:
    """The device this rank uses now (its current one), as "host device" naming the physical device.

    The device's UUID where torch reports one, so that ranks each shown a different
    device as index 0 (CUDA_VISIBLE_DEVICES) count as apart; else its index on the host.
    """
    import torch

    module = torch.get_device_module(device_type)
    index = module.current_device()
    uuid = getattr(module.get_device_properties(index), "uuid", None) if hasattr(module, "get_device_properties") else None
    return f"{socket.gethostname()} {uuid if uuid is not None else f'{device_type}:{index}'}"


def _each_rank_has_own_device(store, rank: int, size: int, device_type: str) -> bool:
    """Whether no two ranks of the group use the same device (each rank's current device, compared).

    Every rank answers the same (each reads all ranks' devices).
    """
    if size == 1:
        return True
    store.set(f"dlop-devices/{rank}", _device_in_use(device_type))
    devices = [store.get(f"dlop-devices/{r}").decode() for r in range(size)]
    return len(set(devices)) == size


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
        raise ValueError(f"{ENV}={name!r}: not a torch.distributed backend (use auto, staged, nccl, gloo, ...)")
    opts = dist.distributed_c10d._DistributedBackendOptions()
    opts.store, opts.group_rank, opts.group_size, opts.timeout = prefixed, rank, size, timeout
    opts.group_id, opts.global_ranks_in_group = dist_options.group_id, dist_options.global_ranks_in_group
    return plugin.creator_fn(opts, None) if plugin.extended_api else plugin.creator_fn(prefixed, rank, size, timeout)


def attach_device_backend(pg, dist_options) -> None:
    """Gives `pg` (a dlop._C.ProcessGroupDlop) its delegate, as DLOP_DEVICE_BACKEND says."""
    import torch.distributed as dist

    name = choice()
    if name == "staged":
        return
    store = dist.PrefixStore(pg.store_namespace + "/", dist_options.store)
    if name == "auto":
        native = _native()
        if native is None:
            return
        device_type, name = native
        if not _each_rank_has_own_device(store, dist_options.group_rank, dist_options.group_size, device_type):
            return
        pg.set_device_backend(_make(name, store, dist_options), name, [device_type], True)
        return
    served = dist.Backend.backend_capability.get(name)
    if served is None:
        raise ValueError(f"{ENV}={name!r}: not a torch.distributed backend (use auto, staged, nccl, gloo, ...)")
    pg.set_device_backend(_make(name, store, dist_options), name, list(served), False)
