"""The out-of-sample measurements the scaling model is checked against: runs across namespace hosts.

Ranks sit on hosts in rank order, ``per_host`` each (torchrun's placement):
rank r on host r // per_host. ``allreduce`` times dlop's all-reduce with one
algorithm forced (DLOP_ALGO) beside Gloo's, through torch
(``bench.c10d``); ``ddp`` trains (``bench.ddp``) with dlop's own
choice of algorithm, Gloo and the model alone alternating.
"""

from __future__ import annotations

from pathlib import Path

from bench.common import _common
from bench.linearity.linearity_calibrate import CpuMeter, c10d_args, launch_ranks


def allreduce(hosts, n_hosts: int, per_host: int, algorithm: str, sizes: str, repetitions: int, out: Path,
              tag: str, port: int) -> list[dict]:
    """[{"impl": "dlop" | "gloo", "bytes", "time_us"}] for dlop forced to `algorithm`, Gloo beside it."""
    path = out / f"allreduce_{tag}.json"
    def args(rank: int) -> list[str]:
        return c10d_args("dlop,gloo", sizes, repetitions, path if rank == 0 else None, check=True)

    launch_ranks(hosts, n_hosts, per_host, "bench.c10d", args, {"DLOP_ALGO": f"allreduce:{algorithm}"},
                 out / f"allreduce_{tag}.txt", f"{algorithm} all-reduce", port)
    _, rows = _common.read_rows(str(path))
    if any(r["wrong"] > 0 for r in rows):
        raise RuntimeError(f"wrong all-reduce results in {path}")
    return [{"impl": r["impl"], "bytes": r["bytes"], "time_us": r["time_us"]} for r in rows
            if r["op"] == "all_reduce" and r["impl"] in ("dlop", "gloo")]


def ddp(hosts, n_hosts: int, per_host: int, ddp_args: list[str], out: Path, tag: str, port: int) -> list[dict]:
    """bench.ddp's rows, each with the background load (cores) it ran beside."""
    path = out / f"ddp_{tag}.json"
    meter = CpuMeter()
    launch_ranks(hosts, n_hosts, per_host, "bench.ddp", lambda r: [*ddp_args, "--json", str(path)], {},
                 out / f"ddp_{tag}.txt", "DDP", port)
    background = meter.background_cores()
    return [dict(r, background_cores=background) for r in _common.read_rows(str(path))[1]]
