"""torchft process groups over dlop (``pip install dlop[ft]``).

torchft reconfigures a group on every quorum change: ``configure(store_addr,
replica_id, rank, world_size, ...)`` aborts the old group and builds a new
one on the store prefix the manager hands out. These classes do it as
torchft's own Gloo wrappers do, with a dlop backend:

* :class:`ProcessGroupDlop` (``"torchft-dlop"``), as ``ProcessGroupGloo``: the
  group lives in this process; ``abort()`` fails what is in flight at once
  (a dead or silent peer included) and frees the old group's UCX worker,
  endpoints and shared memory before the new group is made.
* :class:`ProcessGroupBabyDlop` (``"torchft-baby-dlop"``), as
  ``ProcessGroupBabyGloo``: the group lives in a child process that each
  ``configure()`` replaces; tensors go through shared memory.

Each group has an engine of its own, apart from the process's default dlop
group (FSDP's, in HSDP), which it neither replaces nor joins.
"""

from __future__ import annotations

from datetime import timedelta

import torch
from torch.distributed import ProcessGroup as BaseProcessGroup
from torch.distributed import Store
from torch.distributed.constants import default_pg_timeout
from torchft.process_group import ProcessGroupBaby, ProcessGroupWrapper

__all__ = ["ProcessGroupBabyDlop", "ProcessGroupDlop"]


def check_store_addr(store_addr: str) -> None:
    """Refuses, naming it, an address torchft's ``create_store_client`` cannot read (``host:port/prefix``)."""
    addr, _, _prefix = store_addr.partition("/")
    host, colon, port = addr.rpartition(":")
    if not colon or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"dlop torchft group: store address {store_addr!r} is not host:port/prefix")


def _check_group(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"dlop torchft group: world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"dlop torchft group: rank {rank} is not in a group of {world_size}")


def _create_dlop_pg(store: Store, rank: int, world_size: int, timeout: timedelta, name: str) -> BaseProcessGroup:
    from dlop import _C

    _check_group(rank, world_size)
    backend = _C.ProcessGroupDlop(store, rank, world_size, timeout, [], name, own_engine=True)
    pg = BaseProcessGroup(store, rank, world_size)
    pg._set_default_backend(BaseProcessGroup.BackendType.CUSTOM)
    # CPU tensors, and accelerator tensors staged through host memory, as the
    # Gloo wrapper registers Gloo for both.
    for device in ["cpu"] + ([torch.accelerator.current_accelerator().type] if torch.accelerator.is_available() else []):
        pg._register_backend(torch.device(device), BaseProcessGroup.BackendType.CUSTOM, backend)
    return pg


class ProcessGroupDlop(ProcessGroupWrapper):
    """A reconfigurable dlop group: torchft's ``ProcessGroupGloo`` with dlop underneath.

    Args:
        timeout: of the store connection and of each collective (a silent peer
            fails the call after it; a dead one at once).
    """

    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int, *args, **kwargs) -> None:
        check_store_addr(store_addr)
        _check_group(rank, world_size)
        super().configure(store_addr, replica_id, rank, world_size, *args, **kwargs)

    def _create_pg(self, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        return _create_dlop_pg(store, rank, world_size, self._timeout, f"torchft_quorum_{self._quorum_id}")

    def getBackendName(self) -> str:
        return "torchft-dlop"


class ProcessGroupBabyDlop(ProcessGroupBaby):
    """dlop in a child process, torchft's ``ProcessGroupBabyGloo`` with dlop underneath."""

    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int, *args, **kwargs) -> None:
        check_store_addr(store_addr)
        _check_group(rank, world_size)
        super().configure(store_addr, replica_id, rank, world_size, *args, **kwargs)

    @classmethod
    def _create_pg(cls, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        # The child has no instance to ask: c10d's default, as the Gloo baby's backend has.
        return _create_dlop_pg(store, rank, world_size, default_pg_timeout, "torchft_baby")

    def getBackendName(self) -> str:
        return "torchft-baby-dlop"
