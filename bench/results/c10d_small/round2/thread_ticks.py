"""100000 blocking 8 B all-reduces on dlop, then on the fake group, in one process:
time per call and the CPU ticks each thread used in each phase (is the progress
thread busy?). Usage (DLOP_BASE as in ../run_base_or_branch.py):

    torchrun --standalone --nproc-per-node 2 thread_ticks.py
"""

import glob
import importlib.util
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")

if os.environ.get("DLOP_BASE"):
    base = os.environ["DLOP_BASE"]
    spec = importlib.util.spec_from_file_location("dlop", os.path.join(base, "__init__.py"),
                                                  submodule_search_locations=[base])
    module = importlib.util.module_from_spec(spec)
    sys.modules["dlop"] = module
    spec.loader.exec_module(module)
import dlop  # noqa: E402, F401

N = 100000


def ticks() -> dict:
    """utime + stime per thread name, from /proc."""
    out = {}
    for task in glob.glob("/proc/self/task/*"):
        with open(task + "/comm") as f:
            name = f.read().strip()
        with open(task + "/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0) + int(fields[11]) + int(fields[12])
    return out


def used(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}


dist.init_process_group("dlop")
fake = dist.new_group(backend="fake")
t = torch.zeros(2)
for _ in range(2000):
    dist.all_reduce(t, group=dist.group.WORLD)
phases = []
for group in (dist.group.WORLD, fake):
    start_ticks, start = ticks(), time.perf_counter()
    for _ in range(N):
        dist.all_reduce(t, group=group)
    phases.append(((time.perf_counter() - start) / N * 1e6, used(start_ticks, ticks())))
(dlop_us, dlop_ticks), (fake_us, fake_ticks) = phases
print(f"{dist.get_rank()} dlop {dlop_us:.2f} us fake {fake_us:.2f} us ticks during dlop {dlop_ticks} "
      f"during fake {fake_ticks}", flush=True)
dist.barrier()
