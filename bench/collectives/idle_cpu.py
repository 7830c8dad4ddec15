#!/usr/bin/env python3
"""The CPU an idle process group costs: 2 ranks make one all-reduce, then
sleep for --seconds with the group open; each reports the CPU time its
process used meanwhile (every thread: dlop's progress and fault threads,
Gloo's, UCX's). dlop and Gloo in the same run.

    python -m bench.idle_cpu [--seconds 10]
"""
from __future__ import annotations

import argparse
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.ddp.ddp import free_port


def cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def rank_main(rank: int, world: int, backend: str, port: int, seconds: float, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "dlop":
        import dlop  # noqa: F401  registers the backend
    dist.init_process_group(backend, rank=rank, world_size=world)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == world
    start_cpu, start = cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    used, wall = cpu_seconds() - start_cpu, time.monotonic() - start
    out.put((backend, rank, used, wall))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    print(f"# idle process groups: 2 ranks, {args.seconds:g} s asleep after one all-reduce; "
          f"{os.cpu_count()} cores, torch {torch.__version__}")
    print("| backend | rank | CPU ms used | CPU ms per idle second |")
    print("|---|---|---|---|")
    for backend in ("dlop", "gloo"):
        out = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, 2, backend, port, args.seconds, out)) for r in range(2)]
        for p in procs:
            p.start()
        rows = sorted(out.get(timeout=120 + args.seconds) for _ in procs)
        for p in procs:
            p.join(60)
        for b, r, used, wall in rows:
            print(f"| {b} | {r} | {used * 1e3:.1f} | {used * 1e3 / wall:.2f} |")


if __name__ == "__main__":
    main()
