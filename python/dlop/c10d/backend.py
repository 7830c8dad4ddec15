"""Registration of the "dlop" backend with torch.distributed, and init()."""

from __future__ import annotations

import datetime
import functools
import os

BACKEND_NAME = "dlop"


def _create_backend(dist_options, _backend_options):
    # torch's extended creator API: dist_options carries the group's store,
    # rank, size, timeout, name and its ranks in the default group (empty for
    # the default group itself), which lets sub-groups share its engine.
    from dlop import _C

    pg = _C.ProcessGroupDlop(
        dist_options.store,
        dist_options.group_rank,
        dist_options.group_size,
        dist_options.timeout,
        list(dist_options.global_ranks_in_group),
        str(dist_options.group_id),
    )
    from dlop.c10d.device import attach_device_backend

    attach_device_backend(pg, dist_options)
    return pg


def _device_types() -> list[str]:
    """The device types dlop serves: the CPU and every accelerator torch can name."""
    import torch

    types = ["cpu", "cuda", "xpu"]
    renamed = torch._C._get_privateuse1_backend_name()
    if renamed != "privateuseone":
        types.append(renamed)
    return types


def register_device(device_type: str) -> None:
    """Lets groups made from now on run "dlop" on tensors of `device_type`.

    For an accelerator that names itself (a PrivateUse1 device) after
    ``import dlop``: ``dlop.testing.accelerator`` calls it for ``dlop_test``.
    """
    import torch.distributed as dist

    register_backend()
    served = dist.Backend.backend_capability.setdefault(BACKEND_NAME, [])
    if device_type not in served:
        served.append(device_type)
    _serve_device_in_existing_groups(device_type)


def _serve_device_in_existing_groups(device_type: str) -> None:
    """Groups made before the device was named serve it too (torch maps device types to backends per group)."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    if not c10d.is_initialized():
        return
    from dlop import _C

    for pg in list(c10d._world.pg_map):
        try:
            backend = pg._get_backend(torch.device("cpu"))
        except RuntimeError:
            continue
        if isinstance(backend, _C.ProcessGroupDlop):
            pg._register_backend(torch.device(device_type), c10d.ProcessGroup.BackendType.CUSTOM, backend)


def register_backend() -> None:
    """Registers backend "dlop" for CPU and accelerator tensors (idempotent)."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    # Accelerator tensors are staged through pinned host memory or delegated
    # to the device's own backend (dlop.c10d.device).
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=_device_types())
    _allow_monitored_barrier()


def _allow_monitored_barrier() -> None:
    """Lets torch.distributed.monitored_barrier run on dlop groups.

    torch's Python function refuses every backend but Gloo before it calls the
    group's monitored_barrier, which dlop implements (ProcessGroupDlop::
    monitoredBarrier: rank 0 names the ranks that did not arrive). The wrapper
    runs torch's own steps for dlop groups and hands every other group to
    torch's function unchanged.
    """
    from torch.distributed import distributed_c10d as c10d

    original = c10d.monitored_barrier
    if getattr(original, "_dlop_wrapped", False):
        return

    @functools.wraps(original)
    def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False):
        try:
            on_dlop = not c10d._rank_not_in_group(group) and c10d.get_backend(group) == BACKEND_NAME
        except Exception:  # noqa: BLE001  (no default group and the like: torch's function says so)
            on_dlop = False
        if not on_dlop:
            return original(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)
        # As torch does for Gloo.
        if timeout is None:
            timeout = c10d._get_default_timeout(BACKEND_NAME)
        elif isinstance(timeout, (int, float)):
            timeout = datetime.timedelta(seconds=timeout)
        c10d._check_valid_timeout(timeout)
        group_to_use = c10d._get_default_group() if group is None else group
        return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier._dlop_wrapped = True  # type: ignore[attr-defined]
    c10d.monitored_barrier = monitored_barrier
    import torch.distributed as dist

    if getattr(dist, "monitored_barrier", None) is original:
        dist.monitored_barrier = monitored_barrier


def _autoload() -> None:
    """Entry point (groups torch.backends and torch.distributed.backends)."""
    register_backend()


def _launcher_rank_size() -> tuple[int, int, int, str] | None:
    """(rank, size, local rank, rank variable) from Open MPI, MPICH/PMI or SLURM, if launched by one."""
    env = os.environ
    for rank_var, size_var, local_var in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ):
        if rank_var in env and size_var in env:
            try:
                return int(env[rank_var]), int(env[size_var]), int(env.get(local_var, "0")), rank_var
            except ValueError:
                raise RuntimeError(f"dlop.init: {rank_var}={env[rank_var]!r}, {size_var}={env[size_var]!r}, "
                                   f"{local_var}={env.get(local_var)!r}: not numbers") from None
    return None


def _slurm_rendezvous(env) -> None:
    """MASTER_ADDR (the step's first node) and MASTER_PORT (from the job id) under srun, where not set."""
    from dlop.fleet import slurm

    try:
        if "MASTER_ADDR" not in env:
            addr = slurm.master_addr(env)
            if addr is None and int(env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", "1"))) > 1:
                raise ValueError("dlop.init: a job on several nodes, and neither MASTER_ADDR nor "
                                 "SLURM_STEP_NODELIST/SLURM_JOB_NODELIST names the first one")
            if addr is not None:
                env["MASTER_ADDR"] = addr
        if "MASTER_PORT" not in env:
            port = slurm.master_port(env)
            if port is not None:
                env["MASTER_PORT"] = port
    except ValueError as e:
        raise RuntimeError(str(e)) from None


def init(timeout: datetime.timedelta | None = None, init_method: str | None = None) -> None:
    """Initialises the default process group with backend "dlop".

    Under torchrun (RANK/WORLD_SIZE set) this is init_process_group("dlop").
    Under mpirun or srun it takes rank and size from the launcher's variables,
    sets RANK, WORLD_SIZE and LOCAL_RANK, and rendezvous at MASTER_ADDR:MASTER_PORT.
    Where those are unset: under srun, the first host of SLURM_STEP_NODELIST
    (else SLURM_JOB_NODELIST) and port 20000 + SLURM_JOB_ID % 20000; else
    127.0.0.1:29500 (set MASTER_ADDR to the first host for several hosts).
    """
    import torch.distributed as dist

    register_backend()
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        launched = _launcher_rank_size()
        if launched is None:
            raise RuntimeError(
                "dlop.init: no rank and size found: launch with torchrun (RANK, WORLD_SIZE), "
                "mpirun (OMPI_COMM_WORLD_RANK/SIZE), PMI or srun (SLURM_PROCID, SLURM_NTASKS)"
            )
        rank, size, local_rank, rank_var = launched
        if rank_var == "SLURM_PROCID":
            _slurm_rendezvous(env)
        env.setdefault("LOCAL_RANK", str(local_rank))
        env["RANK"] = str(rank)
        env["WORLD_SIZE"] = str(size)
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", "29500")
    kwargs = {"backend": BACKEND_NAME, "init_method": init_method or "env://"}
    if timeout is not None:
        kwargs["timeout"] = timeout
    dist.init_process_group(**kwargs)
