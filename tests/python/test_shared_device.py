"""Ranks that share one accelerator reduce in its memory (DLOP_DEVICE_BACKEND=auto), on dlop_test.

Every rank of these groups uses dlop_test:0 (DLOP_TEST_DEVICE_COUNT=1), whose
memory is shared between the rank processes by handle, as CUDA's IPC shares a
GPU's. What a user relies on:

* all-reduces give every rank the same exact result, against a reference
  computed in float64 from every rank's inputs, across sizes (1, odd, over
  one slot, so several chunks), dtypes, operations and 2 or 3 ranks; with no
  wait for the device on the caller's thread;
* what the path does not serve (an empty tensor, a non-contiguous one, other
  collectives) is staged and still right, in the same program;
* tensors of different sizes on different ranks raise a clear error on every
  rank, no hang, and the group fails its later calls at once;
* no rank frees its memory while a peer may still read it: a rank that
  shuts its group down at once after its all-reduce keeps its memory until
  the slowest rank's reduce has read it (freed memory poisons itself on
  dlop_test, so a read after the free gives NaN), then every rank lets go;
* a rank SIGKILLed inside a shared-device all-reduce: the others raise an
  error naming it within the group's timeout, and no survivor still maps a
  peer's device memory (each keeps its own, which a peer might still read);
* ranks on different devices stage (auto) or are refused (``shared``);
* DDP's overlap efficiency on this path is at least 0.8 (test_device_overlap
  has the same model staged).
"""

from __future__ import annotations

import os

import pytest
from c10d_harness import Cluster, Dead, Setup, run_ranks

acc = pytest.importorskip("dlop.testing.accelerator", reason="dlop.testing._accelerator is not built")

# Slots of 4 KiB: a few thousand elements already go in several chunks.
ENV = {"DLOP_TEST_DEVICE_COUNT": "1", "DLOP_TEST_DEVICE_DELAY_US": "500", "DLOP_SHARED_DEVICE_BYTES": "4096"}
SETUP = Setup(gloo=False, imports=("dlop.testing.accelerator",), env=ENV)
MAPPING = "dlop_test-device-memory"


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def cluster(request):
    c = Cluster(request.param, SETUP)
    yield c
    c.close()


def _values(rank: int, n: int, dtype, salt: int = 0):
    import torch

    v = (torch.arange(n, dtype=torch.float64) * 7 + rank * 13 + salt * 3) % 17
    if dtype.is_floating_point:
        return (v - 8).to(dtype)
    return (v + 1).to(dtype)


def _reference(op: str, inputs: list, dtype):
    import torch

    stacked = torch.stack([t.to(torch.float64) if dtype.is_floating_point else t.to(torch.int64) for t in inputs])
    if op in ("sum", "premul_sum"):
        out = stacked.sum(0) * (0.5 if op == "premul_sum" else 1)
    elif op == "avg":
        out = stacked.sum(0) / len(inputs)
    elif op == "product":
        out = stacked.prod(0)
    elif op == "max":
        out = stacked.max(0).values
    elif op == "min":
        out = stacked.min(0).values
    else:
        out = inputs[0].to(torch.int64)
        for t in inputs[1:]:
            out = {"band": out & t.to(torch.int64), "bor": out | t.to(torch.int64), "bxor": out ^ t.to(torch.int64)}[op]
    return out.to(dtype)


CASES = [
    (dtype, op)
    for dtype in ("float32", "bfloat16", "float64")
    for op in ("sum", "avg", "premul_sum", "max", "min", "product")
] + [(dtype, op) for dtype in ("int32", "int64", "uint8") for op in ("sum", "max", "min", "band", "bor", "bxor")]


def rank_allreduce_cases(ctx, sizes: list[int]) -> dict:
    import torch
    import torch.distributed as dist

    import dlop.testing.accelerator as acc

    device = torch.device("dlop_test", 0)
    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "product": dist.ReduceOp.PRODUCT, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
           "bxor": dist.ReduceOp.BXOR}
    wrong, waits = [], 0
    pg = dist.group.WORLD._get_backend(device)
    for dtype_name, op in CASES:
        dtype = getattr(torch, dtype_name)
        for n in sizes:
            x = _values(ctx.rank, n, dtype, salt=n).to(device)
            if dtype.is_floating_point and n > 1000:
                x.requires_grad_()  # a Parameter's data, say: reduced as data
            reduce_op = dist._make_nccl_premul_sum(0.5) if op == "premul_sum" else ops[op]
            before = acc.host_waits()
            work = dist.all_reduce(x, op=reduce_op, async_op=True)
            waits += acc.host_waits() - before
            work.wait()
            got = x.detach().cpu()
            expected = _reference(op, [_values(r, n, dtype, salt=n) for r in range(ctx.world_size)], dtype)
            if not torch.equal(got, expected):
                wrong.append(f"{dtype_name} {op} n={n}: {(got.double() - expected.double()).abs().max().item()}")
    # Staged in the same program: what the path does not serve.
    empty = torch.zeros(0, device=device)
    dist.all_reduce(empty)
    strided = _values(ctx.rank, 40, torch.float32).to(device)[::2]
    dist.all_reduce(strided)
    expected = sum(_values(r, 40, torch.float32)[::2] for r in range(ctx.world_size))
    if not torch.equal(strided.cpu(), expected):
        wrong.append("non-contiguous")
    gathered = [torch.zeros(3, device=device) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, torch.full((3,), float(ctx.rank), device=device))
    if [g.cpu().tolist() for g in gathered] != [[float(r)] * 3 for r in range(ctx.world_size)]:
        wrong.append("all_gather")
    return {"wrong": wrong, "waits": waits, "shared": pg.shared_device}


def test_allreduce_in_shared_device_memory_is_exact(cluster):
    sizes = [1, 7, 1000, 5003]  # 5003 floats: 5 chunks of 4 KiB
    for rank, r in enumerate(cluster.run(rank_allreduce_cases, sizes)):
        assert r["shared"] == "dlop_test:0", f"rank {rank} stages: {r}"
        assert not r["wrong"], f"rank {rank}: {r['wrong']}"
        assert r["waits"] == 0, f"rank {rank}: the caller waited for the device {r['waits']} times"


def rank_mismatched_sizes(ctx, sizes: list[int]) -> dict:
    import time

    import torch
    import torch.distributed as dist

    x = torch.ones(sizes[ctx.rank], device="dlop_test:0")
    out = {}
    try:
        dist.all_reduce(x)
        x.cpu()
        out["first"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["first"] = f"{type(e).__name__}: {e}"
    # The group is broken from then on: the next call fails at once, on any path.
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(sizes[0], device="dlop_test:0"))
        out["next"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["next"] = f"{type(e).__name__}: {e}"
    out["next_s"] = time.monotonic() - t0
    return out


# 10 and 11 elements: one chunk each. 1500 and 1000 floats: two chunks against
# one (slots of 4 KiB), whose first chunks have the same count.
@pytest.mark.parametrize("sizes", [[10, 11], [1500, 1000]], ids=["one-chunk", "chunks"])
def test_tensors_of_different_sizes_raise_on_every_rank_and_break_the_group(sizes):
    setup = Setup(pg_timeout_s=20, **_setup_args())
    for rank, r in enumerate(run_ranks(rank_mismatched_sizes, 2, sizes, setup=setup)):
        low, high = sorted(sizes)
        assert "different tensors" in r["first"] and f"{low} to {high} elements" in r["first"], (rank, r)
        assert r["next"] != "no error" and r["next_s"] < 5, (rank, r)


def _setup_args(**env) -> dict:
    return {"gloo": False, "imports": SETUP.imports, "env": {**ENV, **env}}


def rank_killed_mid_shared_allreduce(ctx, victim: int) -> dict | None:
    import signal
    import threading
    import time

    import torch
    import torch.distributed as dist

    import dlop.testing.accelerator as acc

    x = torch.ones(1 << 16, device="dlop_test:0")
    dist.all_reduce(x)
    pg = dist.group.WORLD._get_backend(x.device)
    shared = pg.shared_device
    acc.configure(op_us=2000)  # a few ms an operator: the kill lands inside an all-reduce
    if ctx.rank == victim:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        while True:
            dist.all_reduce(x)
    t0 = time.monotonic()
    error = None
    try:
        while time.monotonic() - t0 < 120:
            dist.all_reduce(x, async_op=True).wait()
    except Exception as e:  # noqa: BLE001
        error = e
    elapsed = time.monotonic() - t0
    acc.synchronize()
    time.sleep(0.2)  # the streams' waiting threads let go of the memory
    with open("/proc/self/maps") as f:
        mapped = sum(MAPPING in line for line in f)
    return {"elapsed": elapsed, "type": type(error).__name__ if error else None, "message": str(error),
            "shared": shared, "mapped": mapped}


def test_a_rank_killed_inside_a_shared_device_allreduce_fails_the_others_in_time():
    timeout = 20
    victim = 1
    setup = Setup(pg_timeout_s=timeout, **_setup_args())
    results = run_ranks(rank_killed_mid_shared_allreduce, 3, victim, setup=setup, may_die=(victim,), timeout=150)
    assert isinstance(results[victim], Dead), results
    for rank, r in enumerate(results):
        if rank != victim:
            assert r["shared"] == "dlop_test:0", (rank, r)
            assert r["type"] is not None and r["elapsed"] < timeout + 5, (rank, r)
            assert f"rank {victim}" in r["message"], (rank, r)
            # Its own memory is kept: no barrier said that the other survivor had read it.
            assert r["mapped"] == 1, f"rank {rank} maps {r['mapped']} regions of device memory, not its own only"


def rank_shuts_down_while_a_peer_reads(ctx, slow: int, op_us: int) -> dict:
    import time

    import torch
    import torch.distributed as dist

    import dlop.testing.accelerator as acc

    x = torch.full((1000,), float(ctx.rank + 1), device="dlop_test:0")
    dist.all_reduce(x)  # the shared memory is exchanged here
    x.fill_(float(ctx.rank + 1))
    dist.barrier()
    acc.synchronize()
    if ctx.rank == slow:
        # Its reduce sums the slots in rank order, one operator of op_us each:
        # the last rank's slot is read op_us after the others are done.
        acc.configure(op_us=op_us)
    dist.all_reduce(x)
    result = x.cpu()
    acc.configure(op_us=0)
    dist.destroy_process_group()  # the last rank frees its memory here, without a barrier
    deadline = time.monotonic() + 30
    while True:  # until the group's last barrier has let every rank's memory go
        with open("/proc/self/maps") as f:
            mapped = sum(MAPPING in line for line in f)
        if mapped == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(op_us / 1e6)  # a rank exiting early would leave its memory unfreed, and unpoisoned
    return {"result": result.tolist()[:3], "nan": int(result.isnan().sum()), "mapped": mapped}


def test_no_rank_frees_its_memory_while_a_peer_still_reads_it():
    # Rank 0's reduce reads rank 2's slot a second after ranks 1 and 2 are
    # done and have shut their group down. Private engines: the slow rank's
    # operators must not hold the others' compute engine.
    setup = Setup(**_setup_args(DLOP_TEST_DEVICE_SHARE="0"))
    results = run_ranks(rank_shuts_down_while_a_peer_reads, 3, 0, 1_000_000, setup=setup)
    for rank, r in enumerate(results):
        assert r["nan"] == 0 and r["result"] == [6.0] * 3, f"rank {rank} read freed memory: {r}"
        assert r["mapped"] == 0, f"rank {rank} still maps device memory after the group's last barrier: {r}"


def rank_device_choice(ctx) -> dict:
    import torch
    import torch.distributed as dist

    device = torch.device("dlop_test", ctx.rank % torch.dlop_test.device_count())
    x = torch.full((100,), float(ctx.rank + 1), device=device)
    try:
        dist.all_reduce(x)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}
    pg = dist.group.WORLD._get_backend(device)
    return {"error": None, "shared": pg.shared_device, "value": x.cpu()[0].item()}


@pytest.mark.parametrize("choice", ["auto", "shared"])
def test_ranks_on_different_devices_stage_or_are_refused(choice):
    setup = Setup(**_setup_args(DLOP_TEST_DEVICE_COUNT="2", DLOP_DEVICE_BACKEND=choice))
    for rank, r in enumerate(run_ranks(rank_device_choice, 2, setup=setup)):
        if choice == "auto":
            assert r == {"error": None, "shared": None, "value": 3.0}, (rank, r)
        else:
            assert r["error"] and "different devices" in r["error"], (rank, r)


def test_staged_when_asked_on_one_device():
    setup = Setup(**_setup_args(DLOP_DEVICE_BACKEND="staged"))
    for rank, r in enumerate(run_ranks(rank_device_choice, 2, setup=setup)):
        assert r == {"error": None, "shared": None, "value": 3.0}, (rank, r)

