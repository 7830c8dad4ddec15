"""One rank of tests/python/test_multihost.py, run inside a host's network namespace.

``python multihost_rank.py SCENARIO`` with torchrun's variables (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and GLOO_SOCKET_IFNAME. Prints one
problem per line as ``PROBLEM ...`` and ``DONE`` at the end; scenarios:

* ``collectives``: every collective against a reference computed from the
  inputs (each rank's input is a function of its rank, so every rank knows all
  of them), all-reduce also against Gloo;
* ``allreduce``: all-reduce only (the algorithm is forced by DLOP_ALGO);
* ``loop``: all-reduces until one fails; prints the error (the fault test).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import dlop  # noqa: F401  (registers the backend)

DTYPES = (torch.float32, torch.int64)
SIZES = (0, 1, 7, 4099, 1 << 20)  # elements: empty, one, odd, 4 or 8 MiB


def value(rank: int, n: int, dtype, salt: int = 0) -> torch.Tensor:
    """Rank r's input: small integers, so sums are exact in any order and any dtype."""
    return ((torch.arange(n, dtype=torch.int64) * 7 + rank * 31 + salt) % 53 - 20).to(dtype)


class Checker:
    def __init__(self, rank: int, world: int):
        self.rank, self.world, self.problems = rank, world, []

    def expect(self, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
            diff = (got.shape, want.shape) if got.shape != want.shape else int((got != want).sum())
            self.problems.append(f"{what}: differs from the reference ({diff})")


def check_collectives(c: Checker, gloo) -> None:
    rank, world = c.rank, c.world
    for dtype in DTYPES:
        for n in SIZES:
            tag = f"{dtype} n={n}"
            total = sum(value(r, n, dtype) for r in range(world))

            t = value(rank, n, dtype)
            dist.all_reduce(t)
            c.expect(f"all_reduce {tag}", t, total)
            g = value(rank, n, dtype)
            dist.all_reduce(g, group=gloo)
            c.expect(f"all_reduce vs gloo {tag}", t, g)

            t = value(rank, n, dtype)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            c.expect(f"all_reduce max {tag}", t, torch.stack([value(r, n, dtype) for r in range(world)]).amax(0))

            root = world - 1  # on the last host
            t = value(rank, n, dtype)
            dist.broadcast(t, src=root)
            c.expect(f"broadcast {tag}", t, value(root, n, dtype))

            t = value(rank, n, dtype)
            dist.reduce(t, dst=1)
            if rank == 1:
                c.expect(f"reduce {tag}", t, total)

            out = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(out, value(rank, n, dtype))
            for r in range(world):
                c.expect(f"all_gather {tag} [{r}]", out[r], value(r, n, dtype))

            out = [torch.empty(n, dtype=dtype) for _ in range(world)] if rank == 0 else None
            dist.gather(value(rank, n, dtype), gather_list=out, dst=0)
            if rank == 0:
                for r in range(world):
                    c.expect(f"gather {tag} [{r}]", out[r], value(r, n, dtype))

            t = torch.empty(n, dtype=dtype)
            src = world - 1
            pieces = [value(src, n, dtype, salt=j) for j in range(world)] if rank == src else None
            dist.scatter(t, scatter_list=pieces, src=src)
            c.expect(f"scatter {tag}", t, value(src, n, dtype, salt=rank))

            t = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(t, [value(rank, n, dtype, salt=j) for j in range(world)])
            c.expect(f"reduce_scatter {tag}", t, sum(value(r, n, dtype, salt=rank) for r in range(world)))

            out = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_to_all(out, [value(rank, n, dtype, salt=j) for j in range(world)])
            for r in range(world):
                c.expect(f"all_to_all {tag} [{r}]", out[r], value(r, n, dtype, salt=rank))

            # A ring of point-to-point messages: every pair of neighbours, across hosts too.
            t = torch.empty(n, dtype=dtype)
            works = [dist.isend(value(rank, n, dtype, salt=5), (rank + 1) % world),
                     dist.irecv(t, (rank - 1) % world)]
            for w in works:
                w.wait()
            c.expect(f"send/recv {tag}", t, value((rank - 1) % world, n, dtype, salt=5))
    dist.barrier()


def check_allreduce(c: Checker) -> None:
    for dtype in (torch.float32, torch.float64, torch.int64):
        for n in SIZES + ((4 << 20) + 3,):
            t = value(c.rank, n, dtype)
            dist.all_reduce(t)
            c.expect(f"all_reduce {dtype} n={n}", t, sum(value(r, n, dtype) for r in range(c.world)))


def loop_allreduce() -> None:
    t = torch.ones(1 << 20)
    dist.all_reduce(t)
    print("LOOPING", flush=True)
    try:
        for _ in range(100000):
            dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001  (what the test checks)
        print("ERROR " + " ".join(str(e).split()), flush=True)
        # Stay up a while: a survivor that left at once would be the next dead
        # rank the others see, and their errors would name it instead.
        time.sleep(15)
        os._exit(0)
    print("PROBLEM no error after 100000 all-reduces", flush=True)


def main() -> int:
    scenario = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group(backend="dlop", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker(rank, world)
    try:
        if scenario == "collectives":
            check_collectives(c, dist.new_group(backend="gloo"))
        elif scenario == "allreduce":
            check_allreduce(c)
        elif scenario == "loop":
            loop_allreduce()
        else:
            c.problems.append(f"unknown scenario {scenario}")
    except Exception:  # noqa: BLE001
        c.problems.append("raised: " + traceback.format_exc().replace("\n", " | "))
    for p in c.problems[:40]:
        print("PROBLEM " + p, flush=True)
    dist.destroy_process_group()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
