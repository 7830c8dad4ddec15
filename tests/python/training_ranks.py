"""Runs a function on N real rank processes and brings back what each returned.

Used by test_ddp.py and test_fsdp.py: every rank initialises the default
process group with backend "dlop" and one Gloo group over the same ranks, so a
training case can run once on each and the parent compares the two. Ranks are
forked from a server that has imported torch once (processes.py), and a
deadline turns a hang into a failure naming the ranks still running.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import pickle
import time
import traceback
from pathlib import Path

from processes import adopt_environment, python_env, rank_process_context


def _rank_main(fn, rank: int, world_size: int, workdir: str, stacks_at: float, env: dict[str, str]) -> None:
    out = Path(workdir) / f"rank{rank}.pkl"
    # Shortly before the parent gives up, every thread's Python stack goes to
    # a file that the parent's error message includes.
    stacks = open(Path(workdir) / f"rank{rank}.stacks", "w")  # noqa: SIM115  (open until exit)
    faulthandler.dump_traceback_later(max(1.0, stacks_at - time.time()), file=stacks)
    try:
        adopt_environment(env)
        import torch
        import torch.distributed as dist

        import dlop  # noqa: F401  (registers "dlop")

        torch.set_num_threads(1)
        dist.init_process_group(
            backend="dlop",
            init_method=f"file://{workdir}/rendezvous",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=120),
        )
        gloo = dist.new_group(backend="gloo")
        result = fn(rank, world_size, dist.group.WORLD, gloo)
        dist.barrier()
        dist.destroy_process_group()
        out.write_bytes(pickle.dumps(("ok", result)))
    except BaseException:  # noqa: BLE001  (the parent reports it)
        out.write_bytes(pickle.dumps(("error", traceback.format_exc())))
        os._exit(1)


def run_ranks(fn, world_size: int, workdir: Path, timeout_s: float = 240) -> list:
    """fn(rank, world_size, dlop_group, gloo_group) on each rank; its results by rank.

    fn must be a module-level function (it is pickled by name).
    Raises AssertionError with the rank's traceback if one failed, or naming
    the ranks that had not finished after timeout_s.
    """
    ctx = rank_process_context()
    stacks_at = time.time() + timeout_s - 10
    env = python_env()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, str(workdir), stacks_at, env))
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
    for p in procs:
        p.join(max(0.0, (deadline - datetime.datetime.now()).total_seconds()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    results = []
    errors = []
    for r in range(world_size):
        path = workdir / f"rank{r}.pkl"
        if not path.exists():
            errors.append(f"rank {r}: no result (exit code {procs[r].exitcode})")
            continue
        status, value = pickle.loads(path.read_bytes())
        if status == "ok":
            results.append(value)
        else:
            errors.append(f"rank {r} failed:\n{value}")
    if hung:
        errors.insert(0, f"ranks {hung} still running after {timeout_s} s (killed)")
        for r in hung:
            errors.append(f"rank {r} stacks:\n" + (workdir / f"rank{r}.stacks").read_text()[-3000:])
    assert not errors, "\n".join(errors)
    return results
