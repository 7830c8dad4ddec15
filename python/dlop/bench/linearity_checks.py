"""The out-of-sample measurements the scaling model is checked against: runs across namespace hosts.

Ranks sit on hosts in rank order, ``per_host`` each (torchrun's placement):
rank r on host r // per_host. ``allreduce`` times dlop's all-reduce with one
algorithm forced (DLOP_ALGO) beside Gloo's, through torch
(``dlop.bench.c10d``); ``ddp`` trains (``dlop.bench.ddp``) with dlop's own
choice of algorithm, Gloo and the model alone alternating.
"""

from __future__ import annotations

import os
from pathlib import Path

from dlop.bench import _common
from dlop.bench.linearity_calibrate import CpuMeter, _wait_all, c10d_args


def _launch(hosts, n_hosts: int, per_host: int, module: str, args_of, env_extra: dict, log: Path, what: str,
            port: int) -> None:
    world = n_hosts * per_host
    with open(log, "w") as f:
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_host),
                       MASTER_ADDR=hosts.addrs[0], MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                       GLOO_SOCKET_IFNAME=hosts.device, **env_extra)
            env.pop("DLOP_HOST_ID", None)  # the topology comes from the namespaces
            procs.append(hosts.start_module(rank // per_host, module, args_of(rank), env=env, stdout=f))
        _wait_all(procs, f"{what} on {n_hosts} hosts x {per_host} ranks", log)


def allreduce(hosts, n_hosts: int, per_host: int, algorithm: str, sizes: str, repetitions: int, out: Path,
              tag: str, port: int) -> list[dict]:
    """[{"impl": "dlop" | "gloo", "bytes", "time_us"}] for dlop forced to `algorithm`, Gloo beside it."""
    path = out / f"allreduce_{tag}.json"
    def args(rank: int) -> list[str]:
        return c10d_args("dlop,gloo", sizes, repetitions, path if rank == 0 else None, check=True)

    _launch(hosts, n_hosts, per_host, "dlop.bench.c10d", args, {"DLOP_ALGO": f"allreduce:{algorithm}"}, out / f"allreduce_{tag}.txt",
            f"{algorithm} all-reduce", port)
    _, rows = _common.read_rows(str(path))
    if any(r["wrong"] > 0 for r in rows):
        raise RuntimeError(f"wrong all-reduce results in {path}")
    return [{"impl": r["impl"], "bytes": r["bytes"], "time_us": r["time_us"]} for r in rows
            if r["op"] == "all_reduce" and r["impl"] in ("dlop", "gloo")]


def ddp(hosts, n_hosts: int, per_host: int, ddp_args: list[str], out: Path, tag: str, port: int) -> list[dict]:
    """dlop.bench.ddp's rows, each with the background load (cores) it ran beside."""
    path = out / f"ddp_{tag}.json"
    meter = CpuMeter()
    _launch(hosts, n_hosts, per_host, "dlop.bench.ddp", lambda r: [*ddp_args, "--json", str(path)], {},
            out / f"ddp_{tag}.txt", "DDP", port)
    background = meter.background_cores()
    return [dict(r, background_cores=background) for r in _common.read_rows(str(path))[1]]
