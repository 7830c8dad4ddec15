"""Ranks sharing one accelerator reduce in its memory, or this fails: run by scripts/gpu_check.sh.

    DLOP_DEVICE_BACKEND=shared torchrun --nproc-per-node 2 scripts/gpu_shared_probe.py --device cuda

Every rank uses device 0. After all-reduces of a few sizes and dtypes (their
sums checked), each rank asserts that its group's ``pg.shared_device`` names
that device: a handle exchange that failed, and left the group staging, fails
here instead of passing through the staged path unnoticed. Rank 0 prints one
line per rank, "rank R: shared_device DEVICE".
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import dlop  # noqa: F401  (registers the backend)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    if args.device == "dlop_test":
        import dlop.testing.accelerator  # noqa: F401
    device = torch.device(args.device, 0)
    torch.get_device_module(args.device).set_device(0)
    dist.init_process_group("dlop")
    rank, world = dist.get_rank(), dist.get_world_size()
    for numel, dtype in ((1, torch.float32), (1 << 20, torch.float32), (3 << 20, torch.bfloat16), (4099, torch.int64)):
        x = torch.full((numel,), rank + 1, dtype=dtype, device=device)
        dist.all_reduce(x)
        want = world * (world + 1) // 2
        got = x.cpu()
        assert bool((got == want).all()), f"rank {rank}: {numel} x {dtype} summed to {got[:4].tolist()}, not {want}"
    pg = dist.group.WORLD._get_backend(device)
    shared = getattr(pg, "shared_device", None)
    where = [None] * world
    dist.all_gather_object(where, shared)
    if rank == 0:
        for r, d in enumerate(where):
            print(f"rank {r}: shared_device {d}", flush=True)
    dist.destroy_process_group()
    backend = os.environ.get("DLOP_DEVICE_BACKEND")
    assert shared == str(device), (f"rank {rank}: pg.shared_device is {shared!r}, not {device}: the ranks' device "
                                   f"memory was not shared (DLOP_DEVICE_BACKEND={backend})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
