"""Accelerator tensors through backend "dlop", on the test accelerator dlop_test.

Every copy on dlop_test is late on purpose (DLOP_TEST_DEVICE_DELAY_US), and
each rank fills its inputs with a late copy on its current stream, so an op
that does not wait for the caller's stream reads stale inputs, and a caller
that reads results without the Work's stream wait reads stale outputs: both
are wrong results, never luck. Expected values are computed here from every
rank's inputs (each rank can make them all), not by another backend.

Ranks: 2, one device each; 3, where ranks 0 and 2 share device 0.

DLOP_TEST_ACCELERATOR=cuda runs the same tests on GPUs (scripts/gpu_check.sh),
staged or delegated to NCCL as DLOP_DEVICE_BACKEND says; the tests that need
the test accelerator's late copies or its second device are skipped there.
"""

from __future__ import annotations

import functools
import os
import time

import pytest
from c10d_harness import Cluster, Setup, attempt, check, run_ranks

ACCELERATOR = os.environ.get("DLOP_TEST_ACCELERATOR", "dlop_test")
ON_TEST_DEVICE = ACCELERATOR == "dlop_test"
DELAY_US = 2000
DEVICE_SETUP = Setup(gloo=False, imports=("dlop.testing.accelerator",) if ON_TEST_DEVICE else (),
                     env={"DLOP_TEST_DEVICE_DELAY_US": str(DELAY_US)})
needs_test_device = pytest.mark.skipif(not ON_TEST_DEVICE, reason="needs dlop_test's late copies")
DTYPES = ("float32", "float64", "bfloat16", "float16", "int64")
# Bytes of the large case: 12 MiB a rank on 2 ranks is three of DLOP_DEVICE_CHUNK_BYTES's 4 MiB chunks, so a
# chunk's copies overlap both neighbours' (the pipeline's every case), 8 MiB on 3 ranks two.
LARGE = 24 << 20


def _device_count() -> int:
    if ON_TEST_DEVICE:
        return 2
    import torch

    return getattr(torch, ACCELERATOR).device_count()


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks-shared-device"])
def cluster(request):
    c = Cluster(request.param, DEVICE_SETUP)
    yield c
    c.close()


# ---------------------------------------------------------------------------
# Rank side.


def _module():
    import torch

    return getattr(torch, ACCELERATOR)


def _device(ctx):
    import torch

    return torch.device(ACCELERATOR, ctx.rank % _module().device_count())


@functools.lru_cache(maxsize=64)
def _value(rank: int, n: int, dtype, salt: int = 0):
    """Small integers (exact in every dtype, and in sums of a few of them). Read only: cached."""
    import torch

    v = (torch.arange(n, dtype=torch.int32) * 7 + rank * 13 + salt * 5) % 17 - 8
    return v.to(dtype)


def _late_on_device(ctx, cpu):
    """cpu's values on the rank's device, through a late non-blocking copy on the current stream."""
    import torch

    t = torch.empty(cpu.shape, dtype=cpu.dtype, device=_device(ctx))
    t.copy_(cpu.pin_memory(), non_blocking=True)
    return t


def _sum(parts, dtype):
    import torch

    total = parts[0].to(torch.int32)
    for p in parts[1:]:
        total = total + p.to(torch.int32)
    return total.to(dtype)


def _compare(problems, what, got, expected):
    import torch

    got = got.cpu()  # on the current stream: after the Work's end event only if wait() made it wait
    if got.dtype != expected.dtype or got.shape != expected.shape or not torch.equal(got, expected):
        bad = "shape/dtype" if got.shape != expected.shape or got.dtype != expected.dtype else \
            f"{int((got != expected).sum())} of {expected.numel()} elements differ"
        problems.append(f"{what}: {bad}")


def rank_every_op(ctx, dtype_name: str, n: int) -> list[str]:
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, dtype_name)
    size, rank = ctx.world_size, ctx.rank
    problems: list[str] = []
    val = lambda r, m=n, salt=0: _value(r, m, dtype, salt)  # noqa: E731
    dev = lambda cpu: _late_on_device(ctx, cpu)  # noqa: E731
    tag = f"{dtype_name} n={n}"

    t = dev(val(rank))
    dist.all_reduce(t, async_op=True).wait()
    _compare(problems, f"all_reduce sum {tag}", t, _sum([val(r) for r in range(size)], dtype))

    t = dev(val(rank))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    _compare(problems, f"all_reduce max {tag}", t, torch.stack([val(r) for r in range(size)]).max(0).values)

    t = dev(val(rank))
    dist.broadcast(t, src=size - 1, async_op=True).wait()
    _compare(problems, f"broadcast {tag}", t, val(size - 1))

    t = dev(val(rank))
    dist.reduce(t, dst=0)
    if rank == 0:
        _compare(problems, f"reduce {tag}", t, _sum([val(r) for r in range(size)], dtype))

    outs = [dev(torch.zeros(n, dtype=dtype)) for _ in range(size)]
    dist.all_gather(outs, dev(val(rank)), async_op=True).wait()
    for r in range(size):
        _compare(problems, f"all_gather[{r}] {tag}", outs[r], val(r))

    out = dev(torch.zeros(n * size, dtype=dtype))
    dist.all_gather_into_tensor(out, dev(val(rank)))
    _compare(problems, f"all_gather_into_tensor {tag}", out, torch.cat([val(r) for r in range(size)]))

    out = dev(torch.zeros(n, dtype=dtype))
    dist.reduce_scatter(out, [dev(val(rank, n, j)) for j in range(size)], async_op=True).wait()
    _compare(problems, f"reduce_scatter {tag}", out, _sum([val(r, n, rank) for r in range(size)], dtype))

    out = dev(torch.zeros(n, dtype=dtype))
    dist.reduce_scatter_tensor(out, dev(torch.cat([val(rank, n, j) for j in range(size)])))
    _compare(problems, f"reduce_scatter_tensor {tag}", out, _sum([val(r, n, rank) for r in range(size)], dtype))

    out = dev(torch.zeros(n * size, dtype=dtype))
    dist.all_to_all_single(out, dev(torch.cat([val(rank, n, j) for j in range(size)])))
    _compare(problems, f"all_to_all_single {tag}", out, torch.cat([val(r, n, rank) for r in range(size)]))

    outs = [dev(torch.zeros(n, dtype=dtype)) for _ in range(size)]
    dist.all_to_all(outs, [dev(val(rank, n, j)) for j in range(size)])
    for r in range(size):
        _compare(problems, f"all_to_all[{r}] {tag}", outs[r], val(r, n, rank))

    outs = [dev(torch.zeros(n, dtype=dtype)) for _ in range(size)] if rank == 0 else None
    dist.gather(dev(val(rank)), outs, dst=0)
    if rank == 0:
        for r in range(size):
            _compare(problems, f"gather[{r}] {tag}", outs[r], val(r))

    out = dev(torch.zeros(n, dtype=dtype))
    dist.scatter(out, [dev(val(0, n, j)) for j in range(size)] if rank == 0 else None, src=0)
    _compare(problems, f"scatter {tag}", out, val(0, n, rank))

    out = dev(torch.zeros(n, dtype=dtype))
    sent = dist.isend(dev(val(rank)), (rank + 1) % size)
    dist.recv(out, (rank - 1) % size)
    sent.wait()
    _compare(problems, f"send/recv {tag}", out, val((rank - 1) % size))

    pair = [dev(val(rank)), dev(val(rank, n + 1, 1))]
    dist.all_reduce_coalesced(pair)
    _compare(problems, f"all_reduce_coalesced[0] {tag}", pair[0], _sum([val(r) for r in range(size)], dtype))
    _compare(problems, f"all_reduce_coalesced[1] {tag}", pair[1],
             _sum([val(r, n + 1, 1) for r in range(size)], dtype))

    outs = [dev(torch.zeros(n * size, dtype=dtype)), dev(torch.zeros(2 * size, dtype=dtype))]
    with dist._coalescing_manager(async_ops=True) as coalesced:
        dist.all_gather_into_tensor(outs[0], dev(val(rank)))
        dist.all_gather_into_tensor(outs[1], dev(val(rank, 2, 3)))
    coalesced.wait()
    _compare(problems, f"all_gather_into_tensor coalesced[0] {tag}", outs[0], torch.cat([val(r) for r in range(size)]))
    _compare(problems, f"all_gather_into_tensor coalesced[1] {tag}", outs[1],
             torch.cat([val(r, 2, 3) for r in range(size)]))
    return problems


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", ["0", "1", "odd", "large"])
def test_every_op_matches_the_reference(cluster, dtype, size):
    import torch

    if size == "large" and cluster.world_size == 3 and dtype != "float32":
        pytest.skip("large: every dtype on 2 ranks, float32 on 3")
    element = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    n = {"0": 0, "1": 1, "odd": 1001, "large": LARGE // element // cluster.world_size}[size]
    check(cluster, rank_every_op, dtype, n)


def rank_input_ordering(ctx) -> list[str]:
    """The op must start after the copy the caller queued before it (not yet done when the call is made)."""
    import torch
    import torch.distributed as dist

    n, size = 1 << 16, ctx.world_size
    t = torch.zeros(n, device=_device(ctx))
    _module().synchronize(_device(ctx))
    t.copy_(torch.full((n,), float(ctx.rank + 1)).pin_memory(), non_blocking=True)  # late
    dist.all_reduce(t)
    problems: list[str] = []
    _compare(problems, "all_reduce of inputs still being copied", t, torch.full((n,), float(size * (size + 1) // 2)))
    return problems


def rank_output_ordering(ctx, how: str) -> list[str]:
    """What the caller's stream does after wait()/the future must see the results (copied back late)."""
    import torch
    import torch.distributed as dist

    n, size = 1 << 16, ctx.world_size
    t = _late_on_device(ctx, torch.full((n,), float(ctx.rank + 1)))
    work = dist.all_reduce(t, async_op=True)
    if how == "wait":
        work.wait()
    elif how == "synchronize":
        work.synchronize()
    else:
        work.get_future().wait()
    doubled = t * 2  # computed on the host once the current stream is idle
    problems: list[str] = []
    total = float(size * (size + 1) // 2)
    _compare(problems, f"result after {how}()", t, torch.full((n,), total))
    _compare(problems, f"computation after {how}()", doubled, torch.full((n,), 2 * total))
    return problems


@needs_test_device
def test_op_waits_for_the_callers_stream(cluster):
    check(cluster, rank_input_ordering)


@needs_test_device
@pytest.mark.parametrize("how", ["wait", "synchronize", "future"])
def test_callers_stream_waits_for_the_op(cluster, how):
    check(cluster, rank_output_ordering, how)


def rank_wait_does_not_block_host(ctx) -> dict:
    import torch
    import torch.distributed as dist

    import dlop.testing.accelerator as acc

    device = _device(ctx)
    t = torch.ones(1024, device=device)
    torch.dlop_test.synchronize(device)
    # Copies to and from the host are what this test times: a staged group,
    # whether or not the ranks share a device.
    chosen = os.environ.get("DLOP_DEVICE_BACKEND")
    os.environ["DLOP_DEVICE_BACKEND"] = "staged"
    staged = dist.new_group()
    os.environ.pop("DLOP_DEVICE_BACKEND")
    if chosen is not None:
        os.environ["DLOP_DEVICE_BACKEND"] = chosen
    dist.barrier()
    previous = acc.configure(delay_us=300_000)
    try:
        queries, cpu = acc.event_queries(), time.process_time()
        start = time.monotonic()
        work = dist.all_reduce(t, async_op=True, group=staged)
        called = time.monotonic() - start
        work.wait()
        waited = time.monotonic() - start
        queries, cpu = acc.event_queries() - queries, time.process_time() - cpu
        pending = not torch.dlop_test.current_stream(device).query()
        completed_then = work.is_completed()
        torch.dlop_test.synchronize(device)
        synced = time.monotonic() - start
        return {"called": called, "waited": waited, "queries": queries, "cpu": cpu, "pending": pending,
                "completed_then": completed_then,
                "completed": work.is_completed(), "synced": synced,
                "ok": bool(torch.equal(t.cpu(), torch.full((1024,), float(ctx.world_size))))}
    finally:
        acc.configure(**previous)


@needs_test_device
def test_work_wait_does_not_block_the_host_on_the_device(cluster):
    """wait() waits for the host collective (after the 300 ms copy out), not for the 300 ms copy back.

    Meanwhile the device is asked sparingly whether the copy out is done (a GPU's driver serves
    those queries and the training thread's kernel launches alike): the copy-out stream's waiting
    thread asks about once in 2 ms, wakes the engine when it is, and the engine's thread
    sleeps meanwhile. Asked at every pass, the device once saw 3 million queries in those 300 ms,
    and the engine spun a core.
    """
    for rank, r in enumerate(cluster.run(rank_wait_does_not_block_host)):
        # The waiting thread asks about once in 2 ms once it has waited 32 ms (it never spins).
        assert r["queries"] <= 2 * r["waited"] * 1e3, (
            f"rank {rank}: {r['queries']} event queries in {r['waited']:.3f} s: {r}")
        assert r["cpu"] < 0.5 * r["waited"], f"rank {rank}: the wait for the device took a core: {r}"
        assert r["called"] < 0.1, f"rank {rank}: the async call blocked for {r['called']:.3f} s"
        assert r["pending"], f"rank {rank}: the current stream had nothing left to wait for after wait(): {r}"
        assert not r["completed_then"], f"rank {rank}: is_completed() before the copy back finished: {r}"
        assert r["synced"] - r["waited"] > 0.2, f"rank {rank}: wait() returned only once the device was done: {r}"
        assert r["completed"] and r["ok"], f"rank {rank}: {r}"


def rank_mixed_devices(ctx) -> list[str]:
    import torch
    import torch.distributed as dist

    problems = []
    cases = {"cpu": (torch.zeros(4), "cpu")}
    if _module().device_count() > 1:
        other = torch.device(ACCELERATOR, (_device(ctx).index + 1) % _module().device_count())
        cases["other device"] = (torch.zeros(4, device=other), str(other))
    for name, (other, other_name) in cases.items():
        outs = [torch.zeros(4, device=_device(ctx)) for _ in range(ctx.world_size - 1)] + [other]
        _, error = attempt(lambda: dist.all_gather(outs, torch.ones(4, device=_device(ctx))))
        text = str(error)
        if error is None or str(_device(ctx)) not in text or other_name not in text:
            problems.append(f"mixed devices ({name}): {error!r}")
    _, error = attempt(lambda: dist.all_reduce(torch.ones(4, device=_device(ctx), dtype=torch.uint16)))
    if error is None or "UInt16" not in str(error):
        problems.append(f"all_reduce of uint16: {error!r}")
    _, error = attempt(lambda: dist.all_reduce(torch.ones(4, device=_device(ctx), dtype=torch.complex64),
                                               op=dist.ReduceOp.MAX))
    if error is None or "complex" not in str(error):
        problems.append(f"MAX of complex: {error!r}")
    t = _late_on_device(ctx, torch.ones(8))  # every rank refused the same calls: still in step
    dist.all_reduce(t)
    _compare(problems, "all_reduce after the refused calls", t, torch.full((8,), float(ctx.world_size)))
    return problems


def test_bad_calls_fail_on_every_rank_and_the_group_goes_on(cluster):
    check(cluster, rank_mixed_devices)


# ---------------------------------------------------------------------------
# DDP on dlop_test against Gloo on the CPU.


def rank_ddp_matches_gloo(ctx, shared_device: bool) -> float:
    """Largest difference between DDP on dlop_test (backend dlop) and DDP on the CPU (Gloo) after 6 steps."""
    import torch
    import torch.distributed as dist

    device = torch.device(ACCELERATOR, 0 if shared_device else _device(ctx).index)
    _module().set_device(device.index)
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(  # noqa: E731
        torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    model, reference = make(), make()
    reference.load_state_dict(model.state_dict())
    if ctx.rank == 1:  # DDP's first broadcast must make the replicas equal
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    # Small buckets: several all-reduces per step, in flight while backward goes on.
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(device), device_ids=[device.index], bucket_cap_mb=0.004)
    ddp_ref = torch.nn.parallel.DistributedDataParallel(reference, process_group=ctx.gloo, bucket_cap_mb=0.004)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    opt_ref = torch.optim.SGD(ddp_ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(6):
        g = torch.Generator().manual_seed(100 * step + ctx.rank)
        x, y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
        for net, o, dev in ((ddp, opt, device), (ddp_ref, opt_ref, torch.device("cpu"))):
            o.zero_grad()
            torch.nn.functional.cross_entropy(net(x.to(dev)), y.to(dev)).backward()
            o.step()
    return max((p.detach().cpu() - q.detach()).abs().max().item()
               for p, q in zip(ddp.parameters(), ddp_ref.parameters()))


@pytest.mark.parametrize("shared_device", [False, True], ids=["device-per-rank", "one-device"])
def test_ddp_on_the_device_trains_to_gloo_weights_on_the_cpu(shared_device):
    if not shared_device and not ON_TEST_DEVICE and _device_count() < 2:
        pytest.skip(f"one {ACCELERATOR} device")
    setup = Setup(gloo=True, imports=DEVICE_SETUP.imports, env=DEVICE_SETUP.env)
    diffs = run_ranks(rank_ddp_matches_gloo, 2, shared_device, setup=setup, timeout=180)
    assert max(diffs) <= 1e-6, diffs


# ---------------------------------------------------------------------------
# Delegation: DLOP_DEVICE_BACKEND=gloo sends CPU tensors through the delegation code to Gloo.


def rank_delegated_to_gloo(ctx) -> dict:
    import torch
    import torch.distributed as dist

    pg = dist.group.WORLD._get_backend(torch.device("cpu"))
    size = ctx.world_size
    problems: list[str] = []
    t = torch.full((1001,), float(ctx.rank + 1))
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((1001,), float(size * (size + 1) // 2))):
        problems.append("all_reduce through Gloo")
    outs = [torch.zeros(3, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(outs, torch.arange(3) + 10 * ctx.rank)
    if any(not torch.equal(outs[r], torch.arange(3) + 10 * r) for r in range(size)):
        problems.append("all_gather through Gloo")
    # The engine counts a delegated all-reduce as gradient traffic until it completes.
    big = torch.ones(16 << 20)
    work = dist.all_reduce(big, async_op=True)
    counted_while_running = pg.gradients_in_flight
    work.wait()
    deadline = time.monotonic() + 5
    while pg.gradients_in_flight and time.monotonic() < deadline:
        time.sleep(0.001)
    _, refused = attempt(lambda: dist.all_reduce(torch.ones(4, device="dlop_test:0")))
    return {"problems": problems, "work": type(work).__name__, "counted": counted_while_running,
            "after": pg.gradients_in_flight, "refused": str(refused)}


@needs_test_device
def test_delegation_to_gloo_runs_the_calls_and_counts_them_as_gradient_traffic():
    setup = Setup(gloo=False, imports=DEVICE_SETUP.imports, env={"DLOP_DEVICE_BACKEND": "gloo"})
    for rank, r in enumerate(run_ranks(rank_delegated_to_gloo, 2, setup=setup, timeout=120)):
        assert not r["problems"], (rank, r)
        assert "Dlop" not in r["work"], f"rank {rank}: the call was not delegated ({r['work']})"
        assert r["counted"] == 1, f"rank {rank}: {r['counted']} gradients in flight during a delegated all-reduce"
        assert r["after"] == 0, f"rank {rank}: still counted after it completed"
        assert "DLOP_DEVICE_BACKEND=gloo" in r["refused"] and "dlop_test:0" in r["refused"], r["refused"]
