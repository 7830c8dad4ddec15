"""Faults and misuse on backend "dlop".

* A rank SIGKILLed in the middle of all-reduces: the survivors raise within
  the process group's timeout (init_process_group(timeout=...)), naming the
  dead rank; on one host and with every rank a host of its own.
* A peer that never joins: the op fails after the group's timeout, not
  DLOP_TIMEOUT_MS's default.
* Mismatched collectives across ranks, reported on every rank with
  DLOP_DEBUG=detail (both sides named) and with TORCH_DISTRIBUTED_DEBUG=DETAIL
  (torch's wrapper, which compares sequence numbers and shapes as for Gloo).
* Bad arguments (roots, split sizes, dtypes, list lengths, sizes, devices,
  layouts, tags) raise ValueError or RuntimeError naming the problem, before
  anything is sent: the group goes on working.
* destroy_process_group() and interpreter exit, with and without destroy, with
  operations still pending: no dlop thread left, no crash, exit code 0 within
  seconds; a new process group can be made after destroying one.
* monitored_barrier: passes when all arrive; a rank that does not arrive is
  named (the first one, or all of them with wait_all_ranks=True).
"""

from __future__ import annotations

import os
import time

import pytest

from c10d_harness import Cluster, Dead, Setup, attempt, mark_done, run_ranks, shared_cluster, wait_until_done

pytestmark = pytest.mark.long_file(seconds=65)  # handed out first (conftest.py)


def _mro(err) -> list[str]:
    """The exception's classes, module-qualified (the ranks' exceptions do not pickle by class)."""
    return [f"{c.__module__}.{c.__qualname__}" for c in type(err).__mro__]


def _hosts(world: int) -> dict:
    """Every rank a host of its own (no shared memory, no local liveness watchdog)."""
    return {r: {"DLOP_HOST_ID": f"host{r}"} for r in range(world)}


# ---------------------------------------------------------------------------
# Dead and missing ranks.


def rank_killed_mid_allreduce(ctx, victim: int, mode: str) -> dict | None:
    """mode "mid": the victim dies inside an all-reduce loop; "idle": it dies without joining."""
    import signal
    import threading

    import torch
    import torch.distributed as dist

    x = torch.ones(1 << 20)
    dist.barrier()
    if ctx.rank == victim:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        while mode == "mid":
            dist.all_reduce(x)
        time.sleep(60)
    t0 = time.monotonic()
    done = 0
    try:
        while time.monotonic() - t0 < 120:
            dist.all_reduce(x)
            done += 1
    except Exception as e:  # noqa: BLE001
        return dict(elapsed=time.monotonic() - t0, type=type(e).__name__, message=str(e), done=done, mro=_mro(e))
    return dict(elapsed=time.monotonic() - t0, type=None, message="no error", done=done)


@pytest.mark.parametrize(
    "world,victim,mode,hosts",
    [
        (2, 1, "mid", False),
        (3, 1, "mid", False),
        (4, 2, "mid", False),
        (3, 0, "idle", False),
        (2, 1, "mid", True),
        (3, 1, "mid", True),
        (4, 1, "mid", True),
        (3, 2, "idle", True),
    ],
)
def test_sigkill_mid_allreduce(world, victim, mode, hosts):
    pg_timeout = 20
    setup = Setup(pg_timeout_s=pg_timeout, gloo=False, rank_env=_hosts(world) if hosts else {})
    results = run_ranks(rank_killed_mid_allreduce, world, victim, mode, setup=setup, may_die=(victim,), timeout=150)
    assert isinstance(results[victim], Dead) and results[victim].exitcode == -9, results
    for rank, r in enumerate(results):
        if rank == victim:
            continue
        assert "dlop.errors.Error" in r["mro"] and "torch.distributed.DistBackendError" in r["mro"], (rank, r)
        # Raised within the group's timeout (plus what a loaded machine adds).
        assert r["elapsed"] < pg_timeout + 5, (rank, r)
        assert f"rank {victim}" in r["message"], (rank, r)


def rank_peer_never_joins(ctx) -> dict | None:
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        wait_until_done(ctx, "all_reduce", [0])
        return None
    t = time.monotonic()
    err = attempt(lambda: dist.all_reduce(torch.ones(100)))[1]
    mark_done(ctx, "all_reduce")
    return dict(elapsed=time.monotonic() - t, message=str(err), type=type(err).__name__, mro=_mro(err))


@pytest.mark.parametrize("hosts", (False, True))
def test_group_timeout_is_honoured(hosts):
    results = run_ranks(
        rank_peer_never_joins, 2, setup=Setup(pg_timeout_s=3, gloo=False, rank_env=_hosts(2) if hosts else {}), timeout=120
    )
    r = results[0]
    assert r["type"] == "TimeoutError" and "torch.distributed.DistBackendError" in r["mro"] and 2.9 < r["elapsed"] < 10, r
    assert "allreduce" in r["message"] and "3000 ms" in r["message"] and "[1]" in r["message"], r


def rank_big_op_times_out_then_exit(ctx) -> str | None:
    """A 16 MiB all-reduce (rendezvous sends still pending) times out; then the rank exits."""
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        wait_until_done(ctx, "all_reduce", [0])
        return None
    err = attempt(lambda: dist.all_reduce(torch.ones(4 << 20)))[1]
    mark_done(ctx, "all_reduce")
    return type(err).__name__


@pytest.mark.parametrize("hosts", (False, True))
def test_exit_after_a_timed_out_op_with_sends_pending(hosts):
    results = run_ranks(
        rank_big_op_times_out_then_exit, 2, setup=Setup(pg_timeout_s=3, gloo=False, rank_env=_hosts(2) if hosts else {}),
        timeout=120,
    )
    assert results[0] == "TimeoutError"


# ---------------------------------------------------------------------------
# Mismatched collectives.


def rank_mismatch(ctx, case: str) -> dict:
    import torch
    import torch.distributed as dist

    r = ctx.rank

    def go():
        if case == "count":
            dist.all_reduce(torch.ones(10 + r))
        elif case == "dtype":
            dist.all_reduce(torch.ones(10, dtype=torch.float32 if r == 0 else torch.float64))
        elif case == "op":
            dist.all_reduce(torch.ones(10), op=dist.ReduceOp.SUM if r == 0 else dist.ReduceOp.MAX)
        elif case == "kind":
            if r == 0:
                dist.all_reduce(torch.ones(10))
            else:
                dist.broadcast(torch.ones(10), src=0)
        elif case == "root":
            dist.broadcast(torch.ones(10), src=min(r, 1))

    t = time.monotonic()
    err = attempt(go)[1]
    return dict(elapsed=time.monotonic() - t, type=type(err).__name__, message=str(err), mro=_mro(err))


@pytest.mark.parametrize("case", ("count", "dtype", "op", "kind", "root"))
def test_mismatch_reported_with_dlop_debug_detail(case):
    results = run_ranks(rank_mismatch, 2, case, setup=Setup(pg_timeout_s=20, gloo=False, env={"DLOP_DEBUG": "detail"}), timeout=120)
    for rank, r in enumerate(results):
        assert "builtins.ValueError" in r["mro"] or "builtins.RuntimeError" in r["mro"], (rank, r)
        assert "mismatched collectives" in r["message"] and "rank 0" in r["message"] and "rank 1" in r["message"], r
        assert r["elapsed"] < 10, r


@pytest.mark.parametrize("case", ("count", "dtype", "kind"))
def test_mismatch_reported_with_torch_distributed_debug_detail(case):
    """torch's ProcessGroupWrapper checks shapes, dtypes and op types (not reduce ops or roots), as with Gloo."""
    results = run_ranks(
        rank_mismatch, 2, case, setup=Setup(pg_timeout_s=20, gloo=False, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}), timeout=120
    )
    for rank, r in enumerate(results):
        assert r["type"] == "RuntimeError", (rank, r)
        assert "Detected mismatch between collectives on ranks" in r["message"], r


# ---------------------------------------------------------------------------
# Bad arguments: raised on every rank before anything is sent.


def rank_bad_arguments(ctx) -> list[str]:
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import (
        AllgatherOptions,
        AllreduceOptions,
        BroadcastOptions,
        ReduceOptions,
        ReduceScatterOptions,
    )

    world, rank = ctx.world_size, ctx.rank
    pg = dist.group.WORLD._get_backend(torch.device("cpu"))
    f = lambda n=4, dt=torch.float32: torch.ones(n, dtype=dt)  # noqa: E731

    def opts(cls, **kw):
        o = cls()
        for k, v in kw.items():
            setattr(o, k, v)
        return o

    cases = {
        # name: (call, words the message must contain, lower-cased)
        "broadcast root out of range": (lambda: pg.broadcast([f()], opts(BroadcastOptions, rootRank=world)).wait(), ["root"]),
        "reduce negative root": (lambda: pg.reduce([f()], opts(ReduceOptions, rootRank=-1)).wait(), ["root"]),
        "all_to_all_single split sizes do not add up": (
            lambda: dist.all_to_all_single(f(world * 2), f(world * 2), [2] * world, [1] * world),
            ["split"],
        ),
        "all_to_all_single wrong number of split sizes": (
            lambda: dist.all_to_all_single(f(world * 2), f(world * 2), [2] * (world + 1), [2] * (world + 1)),
            ["split"],
        ),
        "all_gather mixed dtypes": (lambda: dist.all_gather([f(4, torch.float64) for _ in range(world)], f()), ["dtype"]),
        "all_gather wrong list length": (lambda: dist.all_gather([f() for _ in range(world + 1)], f()), [str(world)]),
        "all_gather_into_tensor wrong output size": (lambda: dist.all_gather_into_tensor(f(4 * world + 1), f()), ["element"]),
        "all_gather_into_tensor mixed dtypes": (
            lambda: dist.all_gather_into_tensor(f(4 * world, torch.float64), f()),
            ["dtype"],
        ),
        "reduce_scatter_tensor wrong input size": (lambda: dist.reduce_scatter_tensor(f(4), f(4 * world + 3)), ["element"]),
        "reduce_scatter wrong list length": (lambda: dist.reduce_scatter(f(4), [f() for _ in range(world + 1)]), [str(world)]),
        "all_reduce_coalesced mixed dtypes": (
            lambda: dist.all_reduce_coalesced([f(), f(4, torch.float64)]),
            ["dtype"],
        ),
        "all_to_all wrong list length": (lambda: dist.all_to_all([f() for _ in range(world)], [f() for _ in range(world + 1)]), [str(world)]),
        "all_reduce two tensors": (lambda: pg.allreduce([f(), f()], AllreduceOptions()).wait(), ["one tensor"]),
        "all_reduce bitwise op on float": (lambda: dist.all_reduce(f(), op=dist.ReduceOp.BAND), ["band", "float"]),
        "all_reduce dtype without a reduction": (lambda: dist.all_reduce(torch.ones(4, dtype=torch.uint16)), ["uint16"]),
        "all_reduce sparse max": (lambda: dist.all_reduce(torch.ones(4).to_sparse(), op=dist.ReduceOp.MAX),
                                  ["sparse", "summed"]),
        "allgather option list mismatch": (
            lambda: pg.allgather([[f() for _ in range(world)], [f() for _ in range(world)]], [f()], AllgatherOptions()).wait(),
            ["output list"],
        ),
        "reduce_scatter mixed dtypes": (
            lambda: pg.reduce_scatter([f()], [[f(4, torch.float64) for _ in range(world)]], ReduceScatterOptions()).wait(),
            ["dtype"],
        ),
        "send to a rank outside the group": (lambda: pg.send([f()], world, 0).wait(), ["rank"]),
        "recv from a rank outside the group": (lambda: pg.recv([f()], world + 3, 0).wait(), ["rank"]),
        "send with a negative tag": (lambda: pg.send([f()], (rank + 1) % world, -5).wait(), ["tag"]),
    }
    if world > 1:
        cases["all_to_all_single rows not divisible"] = (
            lambda: dist.all_to_all_single(f(world * 2 + 1), f(world * 2 + 1)),
            ["divisible"],
        )
    problems = []
    for name, (call, words) in cases.items():
        _, err = attempt(call)
        if err is None:
            problems.append(f"{name}: no error")
            continue
        text = str(err).lower()
        if not isinstance(err, (ValueError, RuntimeError)):
            problems.append(f"{name}: {type(err).__name__} (not ValueError/RuntimeError): {err}")
        elif not all(w in text for w in words):
            problems.append(f"{name}: message does not name {words}: {str(err)[:300]}")
    # Nothing was sent: the group still works.
    x = torch.full((3,), float(rank))
    dist.all_reduce(x)
    if x.tolist() != [float(sum(range(world)))] * 3:
        problems.append(f"all_reduce after the bad calls gave {x.tolist()}")
    return problems


@pytest.fixture(scope="module", params=(1, 2, 3), ids=lambda n: f"world{n}")
def cluster(request):
    return shared_cluster(request.param)


def test_bad_arguments_raise_naming_the_problem(cluster):
    from c10d_harness import check

    check(cluster, rank_bad_arguments)


def rank_recv_buffer_too_small(ctx) -> dict | None:
    import torch
    import torch.distributed as dist

    if ctx.rank == 0:
        dist.send(torch.ones(100), dst=1)
        return None
    err = attempt(lambda: dist.recv(torch.zeros(10), src=0))[1]
    return dict(type=type(err).__name__, message=str(err), mro=_mro(err))


def test_recv_buffer_too_small():
    results = run_ranks(rank_recv_buffer_too_small, 2, setup=Setup(pg_timeout_s=20, gloo=False), timeout=120)
    r = results[1]
    assert "builtins.RuntimeError" in r["mro"] and "longer than the buffer" in r["message"], r


# ---------------------------------------------------------------------------
# Shutdown and exit.


def _thread_names() -> list[str]:
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return names


def rank_destroy_leaves_no_threads(ctx) -> dict:
    import torch
    import torch.distributed as dist

    sub = dist.new_group(list(range(ctx.world_size)))
    x = torch.ones(1000)
    dist.all_reduce(x)
    dist.all_reduce(x, group=sub)
    fut = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value())
    fut.wait()
    during = [n for n in _thread_names() if n.startswith("dlop")]
    dist.destroy_process_group()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(n.startswith("dlop") for n in _thread_names()):
        time.sleep(0.05)
    after = [n for n in _thread_names() if n.startswith("dlop")]
    return dict(during=during, after=after)


def test_destroy_leaves_no_dlop_threads():
    results = run_ranks(rank_destroy_leaves_no_threads, 2, setup=Setup(gloo=False, teardown="exit"), timeout=120)
    for r in results:
        assert "dlop-progress" in r["during"] and r["after"] == [], r


def rank_reinit(ctx, port: int) -> list[float]:
    import datetime

    import torch
    import torch.distributed as dist

    dist.destroy_process_group()
    values = []
    for i in range(2):
        dist.init_process_group(
            "dlop", init_method=f"tcp://127.0.0.1:{port + i}", rank=ctx.rank, world_size=ctx.world_size,
            timeout=datetime.timedelta(seconds=60),
        )
        x = torch.full((2,), float(ctx.rank + i))
        dist.all_reduce(x)
        values.append(x[0].item())
        dist.destroy_process_group()
    return values


def test_init_again_after_destroy():
    from c10d_harness import free_port

    port = free_port()
    while True:  # two consecutive free ports
        try:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            port = free_port()
    results = run_ranks(rank_reinit, 2, port, setup=Setup(gloo=False, teardown="exit"), timeout=120)
    assert results == [[1.0, 3.0]] * 2


def rank_leave_pending(ctx, kind: str) -> str:
    """Rank 0 leaves operations that rank 1 never joins pending (kept referenced, or dropped)."""
    import torch
    import torch.distributed as dist

    if ctx.rank == 0:
        x, y = torch.ones(1 << 20), torch.ones(10)
        works = [dist.all_reduce(x, async_op=True), dist.irecv(y, src=1)]
        if ctx.gloo is not None:
            works.append(dist.all_reduce(torch.ones(3), group=ctx.gloo, async_op=True))
        if kind == "kept":
            ctx.state["pending"] = (works, x, y)
    return "left"


@pytest.mark.parametrize("teardown", ("destroy", "exit"))
@pytest.mark.parametrize("kind", ("kept", "dropped"))
@pytest.mark.parametrize("hosts", (False, True))
def test_exit_with_operations_pending(teardown, kind, hosts):
    cluster = Cluster(2, Setup(teardown=teardown, gloo=False, rank_env=_hosts(2) if hosts else {}), timeout=120)
    cluster.start()
    try:
        assert cluster.run(rank_leave_pending, kind) == ["left", "left"]
    except BaseException:
        cluster.kill()
        raise
    t = time.monotonic()
    codes = cluster.close(timeout=30)
    elapsed = time.monotonic() - t
    assert codes == [0, 0] and elapsed < 15, (codes, elapsed)


@pytest.mark.parametrize("teardown", ("destroy", "exit"))
def test_exit_with_and_without_destroy(teardown):
    cluster = Cluster(3, Setup(teardown=teardown), timeout=120)
    cluster.start()
    try:
        cluster.run(rank_leave_pending, "none")
    except BaseException:
        cluster.kill()
        raise
    t = time.monotonic()
    codes = cluster.close(timeout=30)
    assert codes == [0, 0, 0] and time.monotonic() - t < 15, codes


# ---------------------------------------------------------------------------
# monitored_barrier.


def rank_monitored_barrier(ctx, absent: tuple, wait_all: bool) -> dict:
    import datetime

    import torch.distributed as dist

    if ctx.rank in absent:
        wait_until_done(ctx, "monitored_barrier", [r for r in range(ctx.world_size) if r not in absent])
        return {}
    t = time.monotonic()
    err = attempt(lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=2), wait_all_ranks=wait_all))[1]
    mark_done(ctx, "monitored_barrier")
    return dict(elapsed=time.monotonic() - t, error=None if err is None else f"{type(err).__name__}: {err}")


@pytest.mark.parametrize("world", (1, 2, 4))
def test_monitored_barrier_passes(world):
    results = run_ranks(rank_monitored_barrier, world, (), False, setup=Setup(gloo=False), timeout=120)
    assert all(r["error"] is None for r in results), results


@pytest.mark.parametrize("wait_all", (False, True))
def test_monitored_barrier_names_the_missing_rank(wait_all):
    results = run_ranks(rank_monitored_barrier, 4, (2, 3), wait_all, setup=Setup(gloo=False), timeout=120)
    r0 = results[0]
    assert r0["error"] is not None and r0["elapsed"] < 10, r0
    if wait_all:
        assert "Ranks 2, 3" in r0["error"] and "monitoredBarrier" in r0["error"], r0
    else:
        assert "Rank 2" in r0["error"] and "monitoredBarrier" in r0["error"], r0
    assert results[1]["error"] is not None and "rank 0" in results[1]["error"].lower(), results[1]
