"""DLOP_LOG_LEVEL=info names the algorithm that served each operation, once
per (operation, size class, group), with the reason: forced by DLOP_ALGO,
the tuning table, and the preferred algorithms that declined."""

from __future__ import annotations

import os
import re
import sys

from c10d_harness import Setup, run_ranks

LINE = re.compile(r"comm (\d+) \((\d+) ranks\): (\w+) of (\d+) to (\d+) B: algorithm (\w+) \((.*)\)$")


def rank_log_lines(ctx) -> list[tuple]:
    """Runs a few operations with stderr going to a file; the algorithm lines logged meanwhile."""
    import torch
    import torch.distributed as dist

    path = ctx.workdir / f"stderr{ctx.rank}"
    saved = os.dup(2)
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    try:
        for _ in range(5):
            dist.all_reduce(torch.ones(1000))  # 4000 B: one size class, however many calls
        for _ in range(3):
            dist.all_reduce(torch.ones(3000))  # 12000 B: another
        dist.all_reduce(torch.ones(1000, dtype=torch.float64))  # 8000 B: a third
        for _ in range(3):
            dist.broadcast(torch.ones(1000), src=0)
        dist.barrier()
    finally:
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)
    lines = [m.groups() for line in path.read_text().splitlines() if (m := LINE.search(line))]
    return lines


def test_algorithm_logged_once_per_operation_and_size_class():
    # Each rank a host of its own: the shared-memory algorithm declines, so the
    # reasons show declines (forced by DLOP_ALGO, then the table's first choice).
    setup = Setup(gloo=False, env={"DLOP_LOG_LEVEL": "info", "DLOP_ALGO": "allreduce:shm"},
                  rank_env={r: {"DLOP_HOST_ID": f"host{r}"} for r in range(2)})
    for rank, lines in enumerate(run_ranks(rank_log_lines, 2, setup=setup, timeout=120)):
        by_key = {}
        for comm, ranks, op, lo, hi, algorithm, why in lines:
            assert ranks == "2", lines
            key = (comm, op, int(lo), int(hi))
            assert key not in by_key, f"rank {rank}: logged twice: {key}: {lines}"
            by_key[key] = (algorithm, why)
        allreduces = sorted((lo, hi, a, why) for (_, op, lo, hi), (a, why) in by_key.items() if op == "allreduce")
        assert [(lo, hi) for lo, hi, _, _ in allreduces] == [(2048, 4095), (4096, 8191), (8192, 16383)], lines
        for lo, hi, algorithm, why in allreduces:
            assert algorithm != "shm", lines
            # The forced one first, then the table's one-host algorithms that declined
            # (inline only up to 4 KiB), in table order.
            forced, *table = why.removeprefix("tuning table; declined: ").split(", ")
            assert forced == "shm (forced by DLOP_ALGO)", lines
            assert table == (["inline", "shm"] if lo < 4096 else ["shm"]), lines
        assert allreduces[0][2] == "recursive_doubling", lines  # the table's choice up to 16 KiB
        broadcasts = [(a, why) for (_, op, lo, hi), (a, why) in by_key.items() if op == "broadcast"]
        assert broadcasts == [("binomial", "tuning table")], lines
        barriers = [(a, why) for (_, op, lo, hi), (a, why) in by_key.items() if op == "barrier"]
        assert barriers == [("dissemination", "tuning table")], lines


def rank_quiet(ctx) -> str:
    import torch
    import torch.distributed as dist

    path = ctx.workdir / f"quiet{ctx.rank}"
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    try:
        dist.all_reduce(torch.ones(1000))
    finally:
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)
    return path.read_text()


def test_forced_algorithm_is_named_and_warn_level_is_quiet():
    setup = Setup(gloo=False, env={"DLOP_LOG_LEVEL": "info", "DLOP_ALGO": "allreduce:ring"})
    for lines in run_ranks(rank_log_lines, 2, setup=setup, timeout=120):
        ring = [(lo, a, why) for _, _, op, lo, _, a, why in lines if op == "allreduce"]
        assert ring and all(a == "ring" and why == "forced by DLOP_ALGO" for _, a, why in ring), lines
    for text in run_ranks(rank_quiet, 2, setup=Setup(gloo=False, env={"DLOP_LOG_LEVEL": "warn"}), timeout=120):
        assert "algorithm" not in text, text
