#!/usr/bin/env python3
"""All-reduce latency while torch's intra-op threads keep every core busy, as
in CPU DDP, where backward computes on all cores while earlier buckets are
reduced. 2 ranks, torch.set_num_threads(all cores); a background thread in
each rank multiplies matrices without pause while the main thread times
all-reduces. dlop (its automatic wait policy, then DLOP_PROGRESS=spin) and
Gloo in the same run; the policy each dlop rank ended with is printed.

    python -m bench.busy_cores [--calls 200] [--sizes 8,4096,65536]
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.ddp.ddp import free_port


def rank_main(rank: int, world: int, backend: str, env: dict, port: int, sizes: list[int], calls: int, out) -> None:
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "dlop":
        import dlop  # noqa: F401  registers the backend
    torch.set_num_threads(os.cpu_count() or 1)
    dist.init_process_group(backend, rank=rank, world_size=world)
    stop = threading.Event()

    def compute() -> None:
        a = torch.randn(512, 512)
        while not stop.is_set():
            torch.mm(a, a)

    busy = threading.Thread(target=compute)
    busy.start()
    rows = []
    for size in sizes:
        t = torch.ones(max(size // 4, 1))
        for _ in range(10):
            dist.all_reduce(t)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        rows.append((size, statistics.median(times) * 1e6, sorted(times)[int(0.99 * (len(times) - 1))] * 1e6))
    stop.set()
    busy.join()
    out.put((rank, rows))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--sizes", default="8,4096,65536")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ctx = mp.get_context("spawn")
    print(f"# all-reduce beside busy intra-op threads: 2 ranks, torch threads = {os.cpu_count()} cores each, "
          f"{args.calls} timed calls per size; the slower rank's median and p99; torch {torch.__version__}")
    print("| config | bytes | median us | p99 us | median / gloo's |")
    print("|---|---|---|---|---|")
    configs = [("dlop (auto)", "dlop", {"DLOP_PROGRESS": "auto"}), ("dlop (spin)", "dlop", {"DLOP_PROGRESS": "spin"}),
               ("gloo", "gloo", {})]
    results = {}
    for name, backend, env in configs:
        out = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, 2, backend, env, port, sizes, args.calls, out))
                 for r in range(2)]
        for p in procs:
            p.start()
        per_rank = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(60)
        results[name] = [max((rows[i] for _, rows in per_rank), key=lambda r: r[1]) for i in range(len(sizes))]
    for name, _, _ in configs:
        for (size, median, p99), (_, gloo_median, _) in zip(results[name], results["gloo"]):
            print(f"| {name} | {size} | {median:.1f} | {p99:.1f} | {median / gloo_median:.2f} |")


if __name__ == "__main__":
    main()
