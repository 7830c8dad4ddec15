"""N blocking all-reduces of 2 floats through torch.distributed, timed one by one:
median and 10th percentile per call. Usage (DLOP_BASE as in run_base_or_branch.py):

    torchrun --standalone --nproc-per-node 2 loop.py dlop|fake|gloo N
"""

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

impl, n = sys.argv[1], int(sys.argv[2])
dist.init_process_group("dlop")
# dlop: the default group as an object (LOOP_NONE=1: group=None, which costs torch a look-up per call)
group = (None if os.environ.get("LOOP_NONE") else dist.group.WORLD) if impl == "dlop" else dist.new_group(backend=impl)
t = torch.zeros(int(os.environ.get("LOOP_COUNT", "2")))
for _ in range(2000):
    dist.all_reduce(t, group=group)
dist.barrier()
times = []
for _ in range(n):
    start = time.perf_counter_ns()
    dist.all_reduce(t, group=group)
    times.append(time.perf_counter_ns() - start)
times.sort()
print(f"rank {dist.get_rank()} {impl} median {times[n // 2] / 1000:.2f} us p10 {times[n // 10] / 1000:.2f}", flush=True)
dist.barrier()
dist.destroy_process_group()
