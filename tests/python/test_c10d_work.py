"""The Work objects backend "dlop" returns, against Gloo's where they can be compared.

async_op=True returns at once; is_completed, is_success, exception, wait,
wait(timeout) (a short timeout on an op a peer has not joined raises in time,
names the op, and leaves the op to finish once the peer joins), get_future()
(completes with the output tensors, as Gloo's does; .then callbacks that
themselves issue collectives, blocking or not, do not deadlock), result(),
source_rank(); several async ops in flight at once, out of order across groups;
a failed op (group timeout) reports through every one of them. Blocking calls
(asyncOp=False) return their Work complete, with a future made on request.
"""

from __future__ import annotations

import datetime
import time

import pytest

from c10d_harness import Setup, attempt, check, make_input, mark_done, mismatch, run_ranks, shared_cluster, wait_until_done

pytestmark = pytest.mark.long_file(seconds=50)  # handed out first (conftest.py)

WORLDS = (1, 2, 3, 4)


@pytest.fixture(scope="module", params=WORLDS, ids=lambda n: f"world{n}")
def cluster(request):
    return shared_cluster(request.param)


def _need(cluster, n: int):
    if cluster.world_size < n:
        pytest.skip(f"needs {n} ranks")


# ---------------------------------------------------------------------------
# On the ranks.


def rank_async_returns_at_once(ctx, late_s: float) -> dict:
    """The last rank joins late_s late: the others' async call returns at once, not completed."""
    import warnings

    import torch
    import torch.distributed as dist

    dist.barrier(group=ctx.gloo)
    x = torch.full((1000,), float(ctx.rank))
    last = ctx.rank == ctx.world_size - 1
    if last:
        time.sleep(late_s)
    t = time.monotonic()
    work = dist.all_reduce(x, async_op=True)
    issue_s = time.monotonic() - t
    done_at_once = work.is_completed()
    t = time.monotonic()
    returned = work.wait()
    wait_s = time.monotonic() - t
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        success, exc = work.is_success(), work.exception()
    value = work.get_future().wait()
    expected = float(sum(range(ctx.world_size)))
    return dict(
        last=last,
        issue_s=issue_s,
        done_at_once=done_at_once,
        returned=returned,
        wait_s=wait_s,
        completed=work.is_completed(),
        success=success,
        exception=exc,
        result_ok=len(work.result()) == 1 and work.result()[0].data_ptr() == x.data_ptr(),
        future_ok=isinstance(value, list) and len(value) == 1 and bool(torch.all(value[0] == expected)),
        values_ok=bool(torch.all(x == expected)),
    )


def _future_cases(ctx, group):
    """(name, call) pairs: call() issues one async op on group and returns (work, outputs it fills)."""
    import torch
    import torch.distributed as dist

    world, rank = ctx.world_size, ctx.rank

    def all_reduce():
        x = make_input(torch.float32, 9, rank, 1)
        return dist.all_reduce(x, group=group, async_op=True), [x]

    def broadcast():
        x = make_input(torch.int64, 9, rank, 2)
        return dist.broadcast(x, src=0, group=group, async_op=True), [x]

    def all_gather():
        outs = [torch.zeros(5) for _ in range(world)]
        return dist.all_gather(outs, make_input(torch.float32, 5, rank, 3), group=group, async_op=True), outs

    def all_gather_into_tensor():
        out = torch.zeros(5 * world)
        return dist.all_gather_into_tensor(out, make_input(torch.float32, 5, rank, 4), group=group, async_op=True), [out]

    def reduce_scatter_tensor():
        out = torch.zeros(3)
        return dist.reduce_scatter_tensor(out, make_input(torch.float32, 3 * world, rank, 5), group=group, async_op=True), [out]

    def all_to_all_single():
        out = torch.zeros(2 * world)
        return dist.all_to_all_single(out, make_input(torch.float32, 2 * world, rank, 6), group=group, async_op=True), [out]

    def gather():
        outs = [torch.zeros(4) for _ in range(world)] if rank == 0 else None
        return dist.gather(make_input(torch.float32, 4, rank, 7), outs, dst=0, group=group, async_op=True), outs or []

    def scatter():
        out = torch.zeros(4)
        chunks = [make_input(torch.float32, 4, 0, 8 + k) for k in range(world)] if rank == 0 else None
        return dist.scatter(out, chunks, src=0, group=group, async_op=True), [out]

    def reduce():
        x = make_input(torch.float64, 6, rank, 9)
        return dist.reduce(x, dst=0, group=group, async_op=True), [x]

    def barrier():
        return dist.barrier(group=group, async_op=True), []

    return [(f.__name__, f) for f in (all_reduce, broadcast, all_gather, all_gather_into_tensor, reduce_scatter_tensor,
                                      all_to_all_single, gather, scatter, reduce, barrier)]


def rank_future_values(ctx) -> list[str]:
    """get_future().wait() and result() of every op, compared with Gloo's for the same op."""
    import torch

    problems = []
    dl = _future_cases(ctx, None)
    gl = _future_cases(ctx, ctx.gloo)
    for (name, dcall), (_, gcall) in zip(dl, gl):
        dwork, douts = dcall()
        dvalue, derr = attempt(lambda: dwork.get_future().wait())
        gwork, gouts = gcall()
        gvalue, gerr = attempt(lambda: gwork.get_future().wait())
        if derr is not None:
            problems.append(f"{name}: get_future().wait() raised {derr!r}")
            continue
        if not dwork.is_completed():
            problems.append(f"{name}: future done but the work not completed")
        gwork.wait()  # Gloo's reduce_scatter_tensor copies into its output in wait(), after its future
        for i, (d, g) in enumerate(zip(douts, gouts)):
            if name != "reduce" or ctx.rank == 0:
                m = mismatch(f"{name} output {i}", d, g, exact=name not in ("all_reduce", "reduce_scatter_tensor", "reduce"))
                if m:
                    problems.append(m)
        if gerr is None:
            # The future's value holds the outputs, as Gloo's. all_gather_into_tensor:
            # dlop's is [output] (as NCCL's), Gloo's the list of its world_size chunks;
            # compared by content.
            dflat = dvalue if isinstance(dvalue, list) else [dvalue]
            gflat = gvalue if isinstance(gvalue, list) else [gvalue]
            if name == "all_gather_into_tensor":
                dflat, gflat = [torch.cat(dflat)], [torch.cat(gflat)]
            if [tuple(t.shape) for t in dflat] != [tuple(t.shape) for t in gflat]:
                problems.append(f"{name}: future value shapes {[tuple(t.shape) for t in dflat]}, Gloo's {[tuple(t.shape) for t in gflat]}")
            elif name != "reduce" or ctx.rank == 0:
                for i, (d, g) in enumerate(zip(dflat, gflat)):
                    m = mismatch(f"{name} future value {i}", d, g, exact=name not in ("all_reduce", "reduce_scatter_tensor", "reduce"))
                    if m:
                        problems.append(m)
        dres, gres = dwork.result(), attempt(gwork.result)[0]
        if name == "all_gather_into_tensor" and gres is not None:
            dres, gres = [torch.cat(dres)], [torch.cat(gres)]
        if gres is not None and [tuple(t.shape) for t in dres] != [tuple(t.shape) for t in gres]:
            problems.append(f"{name}: result() shapes {[tuple(t.shape) for t in dres]}, Gloo's {[tuple(t.shape) for t in gres]}")
        if name not in ("barrier",) and not dres and douts:
            problems.append(f"{name}: result() is empty")
    return problems


def rank_blocking_work(ctx) -> list[str]:
    """Blocking calls as torch's wrappers make them (the group's method with asyncOp=False): the
    Work is complete when returned, outputs (staged or not) equal Gloo's, and a future asked for
    afterwards is done and holds the outputs."""
    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    from c10d_harness import non_contiguous_like

    pg = dist.distributed_c10d._get_default_group()
    world, rank = ctx.world_size, ctx.rank

    def options(cls, **fields):
        opts = cls()
        opts.asyncOp = False
        for name, value in fields.items():
            setattr(opts, name, value)
        return opts

    def strided(t):
        return non_contiguous_like(t)[0]

    # (dlop call -> (work, outputs), the same through Gloo -> outputs); `make` lays a tensor out
    def all_reduce(make):
        x = make(make_input(torch.float32, 9, rank, 11))
        return pg.allreduce([x], options(c10d.AllreduceOptions)), [x]

    def all_reduce_gloo(make):
        x = make(make_input(torch.float32, 9, rank, 11))
        dist.all_reduce(x, group=ctx.gloo)
        return [x]

    def broadcast(make):
        x = make(make_input(torch.int64, 7, rank, 12))
        return pg.broadcast([x], options(c10d.BroadcastOptions, rootRank=world - 1)), [x]

    def broadcast_gloo(make):
        x = make(make_input(torch.int64, 7, rank, 12))
        dist.broadcast(x, src=world - 1, group=ctx.gloo)
        return [x]

    def all_gather_into_tensor(make):
        out = make(torch.zeros(5 * world))
        return pg._allgather_base(out, make_input(torch.float32, 5, rank, 13), options(c10d.AllgatherOptions)), [out]

    def all_gather_into_tensor_gloo(make):
        out = make(torch.zeros(5 * world))
        dist.all_gather_into_tensor(out, make_input(torch.float32, 5, rank, 13), group=ctx.gloo)
        return [out]

    def reduce_scatter_tensor(make):
        out = make(torch.zeros(3))
        return pg._reduce_scatter_base(out, make_input(torch.float32, 3 * world, rank, 14),
                                       options(c10d.ReduceScatterOptions)), [out]

    def reduce_scatter_tensor_gloo(make):
        out = make(torch.zeros(3))
        dist.reduce_scatter_tensor(out, make_input(torch.float32, 3 * world, rank, 14), group=ctx.gloo)
        return [out]

    if not hasattr(c10d.AllreduceOptions(), "asyncOp"):
        return []  # older torch: no blocking flag, every call takes the asynchronous path
    problems = []
    cases = [(all_reduce, all_reduce_gloo), (broadcast, broadcast_gloo),
             (all_gather_into_tensor, all_gather_into_tensor_gloo), (reduce_scatter_tensor, reduce_scatter_tensor_gloo)]
    for layout, make in (("contiguous", lambda t: t), ("strided", strided)):
        for call, gloo_call in cases:
            name = f"{call.__name__} ({layout})"
            work, outs = call(make)
            if not work.is_completed():
                problems.append(f"{name}: the Work of a blocking call is not complete when returned")
            work.wait()
            expected = gloo_call(lambda t: t)  # Gloo on contiguous tensors: its strided results are not a reference
            for i, (d, g) in enumerate(zip(outs, expected)):
                m = mismatch(f"{name} output {i}", d, g, exact=call is not all_reduce and call is not reduce_scatter_tensor)
                if m:
                    problems.append(m)
            fut = work.get_future()
            if not fut.done():
                problems.append(f"{name}: a future asked for after completion is not done")
            value = fut.wait()
            if len(value) != len(outs) or any(v.data_ptr() != o.data_ptr() for v, o in zip(value, outs)):
                problems.append(f"{name}: the future holds {len(value)} tensors, not the call's outputs")
    work = pg.barrier(options(c10d.BarrierOptions))
    if not work.is_completed() or not work.wait() or not work.get_future().done():
        problems.append("barrier: the Work of a blocking call is not complete when returned")
    return problems


def rank_then_callbacks_issue_collectives(ctx, depth: int) -> list[str]:
    """A chain of depth .then callbacks, each issuing a collective (alternately blocking and async)
    from the thread that completes the previous future; plus two chains side by side."""
    import torch
    import torch.distributed as dist

    world = ctx.world_size
    if ctx.rank == world - 1:
        time.sleep(0.3)  # so the callbacks are attached before the first op completes

    def step(i):
        def cb(fut):
            y = fut.value()[0] + 1
            if i % 2 == 0:
                dist.all_reduce(y)  # blocking, inside the callback
                return [y]
            return dist.all_reduce(y, async_op=True).get_future().wait()

        return cb

    x = torch.ones(16)
    fut = dist.all_reduce(x, async_op=True).get_future()
    for i in range(depth):
        fut = fut.then(step(i))
    value = fut.wait()[0]
    expected = torch.ones(16) * world
    for _ in range(depth):
        expected = (expected + 1) * world
    problems = []
    m = mismatch("then-chain result", value, expected)
    if m:
        problems.append(m)
    return problems


def rank_overlap_across_groups(ctx) -> list[str]:
    """Two groups over the same ranks: the last rank does B first and A 1 s later; on the
    others A (issued first) is still pending when B completes."""
    import torch
    import torch.distributed as dist

    if "ab" not in ctx.state:
        ranks = list(range(ctx.world_size))
        ctx.state["ab"] = (dist.new_group(ranks), dist.new_group(ranks))
    ga, gb = ctx.state["ab"]
    a, b = torch.ones(8), torch.ones(8)
    problems = []
    if ctx.rank == ctx.world_size - 1:
        dist.all_reduce(b, group=gb)
        time.sleep(1.0)
        dist.all_reduce(a, group=ga)
    else:
        wa = dist.all_reduce(a, group=ga, async_op=True)
        wb = dist.all_reduce(b, group=gb, async_op=True)
        wb.wait()
        if wa.is_completed():
            problems.append("A completed before the last rank joined it")
        wa.wait()
    for name, t in (("A", a), ("B", b)):
        if not torch.all(t == ctx.world_size):
            problems.append(f"{name}: {t.tolist()}")
    return problems


def rank_many_in_flight(ctx, count: int) -> list[str]:
    """count async ops of mixed kinds issued back to back, waited in reverse order."""
    import torch
    import torch.distributed as dist

    world, rank = ctx.world_size, ctx.rank
    pending = []
    for i in range(count):
        if i % 3 == 0:
            x = make_input(torch.float64, 1000 + i, rank, i)
            pending.append(("all_reduce", dist.all_reduce(x, async_op=True), x, sum(make_input(torch.float64, 1000 + i, r, i) for r in range(world))))
        elif i % 3 == 1:
            x = make_input(torch.int64, 333, rank, i)
            pending.append(("broadcast", dist.broadcast(x, src=i % world, async_op=True), x, make_input(torch.int64, 333, i % world, i)))
        else:
            out = torch.zeros(50 * world, dtype=torch.uint8)
            w = dist.all_gather_into_tensor(out, make_input(torch.uint8, 50, rank, i), async_op=True)
            pending.append(("all_gather", w, out, torch.cat([make_input(torch.uint8, 50, r, i) for r in range(world)])))
    problems = []
    for i, (name, work, got, expected) in reversed(list(enumerate(pending))):
        work.wait()
        m = mismatch(f"op {i} ({name})", got, expected, exact=name != "all_reduce")
        if m:
            problems.append(m)
    return problems


def rank_big_async_returns_at_once(ctx) -> dict:
    import torch
    import torch.distributed as dist

    # Large enough that the all-reduce itself (about 20 ms at 32 MiB here
    # now) outlasts a descheduled caller on a loaded 2-core machine.
    x = torch.ones((128 << 20) // 4)
    dist.barrier()
    work = dist.all_reduce(x, async_op=True)
    done_at_return = work.is_completed()
    work.wait()
    return dict(done_at_return=done_at_return,
                ok=bool(x[0] == ctx.world_size and x[-1] == ctx.world_size))


def rank_wait_timeout(ctx, op: str) -> dict:
    """The last rank joins op only after the others' wait(1 s) has timed out."""
    import torch
    import torch.distributed as dist

    last = ctx.rank == ctx.world_size - 1
    world = ctx.world_size

    def issue():
        if op == "all_reduce":
            x = torch.ones(5)
            return dist.all_reduce(x, async_op=True), lambda: bool(torch.all(x == world))
        if op == "broadcast":
            x = torch.full((5,), float(ctx.rank))
            return dist.broadcast(x, src=world - 1, async_op=True), lambda: bool(torch.all(x == world - 1))
        if op == "all_gather":
            outs = [torch.zeros(2) for _ in range(world)]
            return dist.all_gather(outs, torch.full((2,), float(ctx.rank)), async_op=True), lambda: [o[0].item() for o in outs] == list(range(world))
        if op == "barrier":
            return dist.barrier(async_op=True), lambda: True
        if op == "recv":
            x = torch.zeros(3)
            if ctx.rank == 0:
                return dist.irecv(x, src=world - 1), lambda: bool(torch.all(x == 7))
            if last:
                return dist.isend(torch.full((3,), 7.0), dst=0), lambda: True
            return None, lambda: True
        raise ValueError(op)

    out = {}
    if last:
        dist.barrier(group=ctx.gloo)  # the others have timed out
        work, ok = issue()
        if work is not None:
            work.wait()
        out["ok"] = ok()
        return out
    work, ok = issue()
    if work is None:
        dist.barrier(group=ctx.gloo)
        out.update(ok=ok(), raised=True, message="(not in this op)", wait_s=0, completed_after=True)
        return out
    t = time.monotonic()
    try:
        work.wait(datetime.timedelta(seconds=1))
        out["raised"] = False
    except Exception as e:  # noqa: BLE001
        out["raised"] = True
        out["type"] = type(e).__name__
        out["message"] = str(e)
    out["wait_s"] = time.monotonic() - t
    out["completed_before_join"] = work.is_completed()
    dist.barrier(group=ctx.gloo)  # let the last rank join
    work.wait()  # the op itself is still on and completes
    out["completed_after"] = work.is_completed()
    out["ok"] = ok()
    return out


def rank_failed_op(ctx) -> dict:
    """The group's timeout is 3 s and the last rank never joins: the op fails, seen through every API."""
    import warnings

    import torch
    import torch.distributed as dist

    if ctx.rank == ctx.world_size - 1:
        wait_until_done(ctx, "failed_op", range(ctx.world_size - 1))
        return {}
    x = torch.ones(4)
    t = time.monotonic()
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future()
    err = attempt(work.wait)[1]
    out = dict(wait_s=time.monotonic() - t, wait_error=repr(err))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out.update(completed=work.is_completed(), success=work.is_success(), exception=repr(work.exception()))
    out["future_error"] = repr(attempt(fut.wait)[1])
    out["future_done"] = fut.done()
    # A blocking call on the broken group: its Work is returned complete, with the error.
    opts = dist.AllreduceOptions()
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False
        blocking = dist.distributed_c10d._get_default_group().allreduce([x], opts)
        out["blocking_completed"] = blocking.is_completed()
        out["blocking_error"] = repr(attempt(blocking.wait)[1])
        out["blocking_future_error"] = repr(attempt(blocking.get_future().wait)[1])
    mark_done(ctx, "failed_op")
    return out


# ---------------------------------------------------------------------------
# Tests.


def test_async_op_returns_at_once(cluster):
    _need(cluster, 2)
    for r in cluster.run(rank_async_returns_at_once, 1.0):
        assert r["returned"] is True and r["completed"] and r["success"] and r["exception"] is None, r
        assert r["result_ok"] and r["future_ok"] and r["values_ok"], r
        if not r["last"]:
            assert r["issue_s"] < 0.5 and not r["done_at_once"] and r["wait_s"] > 0.3, r


def test_async_op_single_rank(cluster):
    if cluster.world_size != 1:
        pytest.skip("one rank")
    (r,) = cluster.run(rank_async_returns_at_once, 0.0)
    assert r["returned"] is True and r["completed"] and r["result_ok"] and r["future_ok"] and r["values_ok"], r


def test_future_values_match_gloo(cluster):
    check(cluster, rank_future_values)


def test_blocking_calls_return_completed_work(cluster):
    check(cluster, rank_blocking_work)


def test_then_callbacks_issuing_collectives_do_not_deadlock(cluster):
    check(cluster, rank_then_callbacks_issue_collectives, 6, timeout=120)


def test_async_ops_overlap_across_groups(cluster):
    _need(cluster, 2)
    check(cluster, rank_overlap_across_groups)


def test_many_async_ops_in_flight(cluster):
    check(cluster, rank_many_in_flight, 48)


def test_async_call_on_128mib_returns_before_the_op_is_done(cluster):
    _need(cluster, 2)
    for r in cluster.run(rank_big_async_returns_at_once):
        assert r["ok"], r
        assert not r["done_at_return"], r


@pytest.mark.parametrize("op", ("all_reduce", "broadcast", "all_gather", "barrier", "recv"))
def test_wait_timeout_raises_in_time_and_names_the_op(cluster, op):
    _need(cluster, 2)
    names = {"all_reduce": "allreduce", "broadcast": "broadcast", "all_gather": "allgather", "barrier": "barrier", "recv": "recv"}
    results = cluster.run(rank_wait_timeout, op)
    for rank, r in enumerate(results):
        assert r["ok"], (rank, r)
        if rank == cluster.world_size - 1 or r.get("message") == "(not in this op)":
            continue
        assert r["raised"], (rank, r)
        assert 0.9 < r["wait_s"] < 5, (rank, r)
        assert names[op] in r["message"] and "timed out" in r["message"].lower(), (rank, r)
        assert not r["completed_before_join"] and r["completed_after"], (rank, r)


@pytest.mark.parametrize("world", (2, 3))
def test_failed_op_reports_through_work_and_future(world):
    results = run_ranks(rank_failed_op, world, setup=Setup(pg_timeout_s=3), timeout=120)
    for r in results[:-1]:
        assert 2.5 < r["wait_s"] < 20, r
        # dlop.TimeoutError (a DistBackendError) through Work.wait and the future alike.
        assert r["wait_error"].startswith("TimeoutError(") and "allreduce" in r["wait_error"], r
        assert r["completed"] and not r["success"] and "allreduce" in r["exception"], r
        assert r["future_done"] and r["future_error"].startswith("TimeoutError(") and "allreduce" in r["future_error"], r
        if "blocking_completed" in r:
            # Refused at once (kCanceled: the group failed earlier), through wait and the future alike.
            assert r["blocking_completed"], r
            for key in ("blocking_error", "blocking_future_error"):
                assert "refused" in r[key] and "allreduce" in r[key], r
