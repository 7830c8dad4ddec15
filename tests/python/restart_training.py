"""A small DDP training script for restart tests, run by torchrun (tests/python/test_restarts.py).

It resumes from its checkpoint, trains to RESTART_STEPS and, on rank 0, writes
the final weights; a kill plan makes it SIGKILL one of its ranks in the
attempts it names. Everything a test needs to know goes to files in
RESTART_DIR, one line per event:

- ``up <attempt> <rank> <world> <pid> <resume step>`` once the process group and DDP are up
  (a barrier follows: no rank steps before all are up);
- ``kill <attempt> <rank> <where>`` just before a rank kills itself;
- ``done <attempt> <rank> <world>`` after the last step;
- ``init <attempt> <rank> <pid>`` just before init_process_group;

each line ends with ``@<time.time()>`` (where a restart's seconds go).

With the argument ``exact`` it trains nothing: it runs collectives of
several sizes whose every result it knows, for RESTART_ITERS iterations, with
inputs drawn from RESTART_JOB (so that two jobs that mixed their traffic
would see wrong sums), and reports ``exact <rank> <world> ok`` or ``exact ...
wrong <what>``.

Environment:
- RESTART_DIR: the folder for the checkpoint, the final weights and the events.
- RESTART_BACKEND: "dlop" (default) or "gloo".
- RESTART_PLAN: JSON list, one entry per attempt (TORCHELASTIC_RESTART_COUNT):
  ``[rank, where]``, where is "before_init", "after_init" or a number k, the
  step k after the one the attempt resumed from; null or a missing entry: no kill.
- RESTART_STEPS (default 40), RESTART_EVERY (checkpoint every, default 5).
- RESTART_REPLICATED=1: every rank trains on the same samples, so that
  DDP's average is bitwise the same for any world size of 1, 2 or 4 (x/2 + x/2
  is x): runs whose world size changes compare with one that keeps it.
- RESTART_TIMEOUT: the process group's timeout in seconds (default 60).
- RESTART_STEP_SLEEP: seconds to sleep in each step (default 0), so that a
  node can leave mid-training.
- RESTART_FINISH_WORLD: the last step waits until the world has this size
  (the launcher restarts the ranks when a node joins).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time


def _event(folder: str, line: str) -> None:
    with open(os.path.join(folder, "events"), "a") as f:  # appends of one short line do not interleave
        f.write(f"{line} @{time.time():.3f}\n")


def main() -> None:
    folder = os.environ["RESTART_DIR"]
    backend = os.environ.get("RESTART_BACKEND", "dlop")
    plan = json.loads(os.environ.get("RESTART_PLAN", "[]"))
    steps = int(os.environ.get("RESTART_STEPS", "40"))
    every = int(os.environ.get("RESTART_EVERY", "5"))
    replicated = os.environ.get("RESTART_REPLICATED") == "1"
    step_sleep = float(os.environ.get("RESTART_STEP_SLEEP", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ["RANK"])
    kill = plan[attempt] if attempt < len(plan) else None
    victim, where = (kill[0], kill[1]) if kill else (-1, None)

    def maybe_die(here: str, step: int | None = None) -> None:
        if rank == victim and (where == here if step is None else where == step - start):
            _event(folder, f"kill {attempt} {rank} {here}")
            os.kill(os.getpid(), signal.SIGKILL)

    start = 0

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    if backend == "dlop":
        import dlop  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    maybe_die("before_init")
    _event(folder, f"init {attempt} {rank} {os.getpid()}")
    timeout = datetime.timedelta(seconds=float(os.environ.get("RESTART_TIMEOUT", "60")))
    dist.init_process_group(backend, timeout=timeout)
    world = dist.get_world_size()
    maybe_die("after_init")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    checkpoint = os.path.join(folder, "checkpoint.pt")
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    ddp = DistributedDataParallel(model)
    _event(folder, f"up {attempt} {rank} {world} {os.getpid()} {start}")
    # No rank starts step 0 (where a plan may kill it) before every rank is up: a rank still in
    # DDP's first broadcast would otherwise see its peer die and never come up.
    dist.barrier()

    finish_world = int(os.environ.get("RESTART_FINISH_WORLD", "0"))
    for step in range(start, steps):
        while step == steps - 1 and world < finish_world:
            time.sleep(0.1)  # until the launcher restarts this rank in a larger world
        if isinstance(where, int):
            maybe_die(f"step_{step}", step)
        g = torch.Generator().manual_seed(1000 * step + (0 if replicated else rank))
        x = torch.randn(4, 8, generator=g)
        y = x.sum(1, keepdim=True).sin()
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if step_sleep:
            time.sleep(step_sleep)
        if (step + 1) % every == 0:
            dist.barrier()  # every rank finished the step: the checkpoint holds it on every rank
            if rank == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1},
                           checkpoint + ".tmp")
                os.replace(checkpoint + ".tmp", checkpoint)
            dist.barrier()
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(folder, "final.pt"))
    dist.destroy_process_group()
    _event(folder, f"done {attempt} {rank} {world}")


class SlowSquares:
    """A map-style dataset whose samples take a while (i*i in 4 floats after SLOW_SECONDS), so that
    an offloader's leases stay open long enough to kill the trainer holding them."""

    SLOW_SECONDS = 0.3

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        import torch

        time.sleep(self.SLOW_SECONDS)
        return torch.full((4,), float(i * i))


def exact() -> None:
    import torch
    import torch.distributed as dist

    import dlop  # noqa: F401

    folder = os.environ["RESTART_DIR"]
    job = int(os.environ.get("RESTART_JOB", "0"))
    iters = int(os.environ.get("RESTART_ITERS", "20"))
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    _event(folder, f"init 0 {rank} {os.getpid()}")
    dist.init_process_group("dlop", timeout=datetime.timedelta(seconds=60))
    world = dist.get_world_size()

    def mine(r: int, it: int, n: int) -> torch.Tensor:  # integers: every order of summation is exact
        g = torch.Generator().manual_seed(job * 1_000_003 + it * 101 + r)
        return torch.randint(-1000, 1000, (n,), generator=g).to(torch.float32)

    wrong = []
    for it in range(iters):
        for n in (5, 4099, 300_000):  # the inline, shared-memory and large algorithms
            got = mine(rank, it, n)
            dist.all_reduce(got)
            if not torch.equal(got, sum(mine(r, it, n) for r in range(world))):
                wrong.append(f"all_reduce of {n} at iteration {it}")
        outs = [torch.zeros(3) for _ in range(world)]
        dist.all_gather(outs, mine(rank, it, 3))
        if not all(torch.equal(o, mine(r, it, 3)) for r, o in enumerate(outs)):
            wrong.append(f"all_gather at iteration {it}")
    dist.barrier()
    dist.destroy_process_group()
    _event(folder, f"exact {rank} {world} " + ("ok" if not wrong else "wrong " + "; ".join(wrong[:3])))


if __name__ == "__main__":
    import sys

    exact() if sys.argv[1:] == ["exact"] else main()
