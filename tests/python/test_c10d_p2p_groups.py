"""Point to point and process sub-groups on backend "dlop".

send/recv (every dtype, sizes 0, 1, odd, 16 MiB), recv from any source
(src=None: the sender comes back from recv and Work.source_rank()), tags,
isend/irecv between every pair at once, batch_isend_irecv, and the
collectives on new_group sub-groups, overlapping groups (a rank in two
groups at once, async ops in both) and groups over the same ranks in turn,
each compared with the expected bytes and with the same calls on Gloo.
"""

from __future__ import annotations

import pytest

from c10d_harness import DTYPE_NAMES, attempt, check, dtype_of, make_input, mismatch, shared_cluster

WORLDS = (1, 2, 3, 4)
DTYPES = DTYPE_NAMES + ("complex64",)


@pytest.fixture(scope="module", params=WORLDS, ids=lambda n: f"world{n}")
def cluster(request):
    return shared_cluster(request.param)


def _need(cluster, n: int):
    if cluster.world_size < n:
        pytest.skip(f"needs {n} ranks")


# ---------------------------------------------------------------------------
# On the ranks.


def rank_send_recv(ctx, dtypes, sizes, use_gloo: bool = False) -> list[str]:
    """A ring: rank r sends to r+1 and receives from r-1 (even ranks send first)."""
    import torch
    import torch.distributed as dist

    world, rank = ctx.world_size, ctx.rank
    group = ctx.gloo if use_gloo else None
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    problems = []
    for dn in dtypes:
        dtype = dtype_of(dn)
        for n in sizes:
            out = make_input(dtype, n, rank, 50)
            got = torch.zeros(n, dtype=dtype)
            if rank % 2 == 0:
                dist.send(out, dst=nxt, group=group, tag=7)
                dist.recv(got, src=prv, group=group, tag=7)
            else:
                dist.recv(got, src=prv, group=group, tag=7)
                dist.send(out, dst=nxt, group=group, tag=7)
            m = mismatch(f"send/recv {dn} n={n} from {prv}", got, make_input(dtype, n, prv, 50))
            if m:
                problems.append(m)
    return problems


def rank_recv_any_source(ctx, rounds: int = 3) -> list[str]:
    """Every rank but 0 sends rounds messages to rank 0, which receives with src=None."""
    import torch
    import torch.distributed as dist

    world, rank = ctx.world_size, ctx.rank
    problems = []
    if rank != 0:
        for i in range(rounds):
            dist.send(make_input(torch.int64, 5, rank, 60 + i), dst=0)
        return problems
    seen: dict[int, int] = {}
    for i in range((world - 1) * rounds):
        t = torch.zeros(5, dtype=torch.int64)
        if i % 2 == 0:
            src = dist.recv(t)  # src=None: any source; returns the sender
            via = "recv"
        else:
            work = dist.irecv(t)
            work.wait()
            src = work.source_rank()
            via = "irecv"
        if not 0 < src < world:
            problems.append(f"{via} from any source returned sender {src}")
            continue
        k = seen.get(src, 0)
        seen[src] = k + 1
        m = mismatch(f"{via} any source message {k} from {src}", t, make_input(torch.int64, 5, src, 60 + k))
        if m:
            problems.append(m)
    if seen != {r: rounds for r in range(1, world)}:
        problems.append(f"messages by sender {seen}")
    return problems


def rank_tags(ctx) -> list[str]:
    """Rank 0 sends tags 1, 2, 3 in order; rank 1 posts the receives in the reverse order."""
    import torch
    import torch.distributed as dist

    problems = []
    if ctx.rank == 0:
        works = [dist.isend(torch.full((4,), float(tag)), dst=1, tag=tag) for tag in (1, 2, 3)]
        for w in works:
            w.wait()
    elif ctx.rank == 1:
        bufs = {tag: torch.zeros(4) for tag in (3, 2, 1)}
        works = [dist.irecv(bufs[tag], src=0, tag=tag) for tag in (3, 2, 1)]
        for w in works:
            w.wait()
        for tag, t in bufs.items():
            if not torch.equal(t, torch.full((4,), float(tag))):
                problems.append(f"tag {tag} received {t.tolist()}")
    return problems


def rank_isend_irecv_all_pairs(ctx, n: int, use_gloo: bool = False) -> list[str]:
    import torch
    import torch.distributed as dist

    world, rank = ctx.world_size, ctx.rank
    group = ctx.gloo if use_gloo else None
    works, bufs = [], {}
    for peer in range(world):
        if peer == rank:
            continue
        bufs[peer] = torch.zeros(n, dtype=torch.float64)
        works.append(dist.irecv(bufs[peer], src=peer, group=group, tag=3))
    for peer in range(world):
        if peer != rank:
            works.append(dist.isend(make_input(torch.float64, n, rank, 70 + peer), dst=peer, group=group, tag=3))
    for w in reversed(works):
        w.wait()
    problems = []
    for peer, t in bufs.items():
        m = mismatch(f"irecv from {peer}", t, make_input(torch.float64, n, peer, 70 + rank))
        if m:
            problems.append(m)
    return problems


def rank_batch_isend_irecv(ctx, n: int) -> list[str]:
    import torch
    import torch.distributed as dist

    world, rank = ctx.world_size, ctx.rank
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got_prev = torch.zeros(n, dtype=torch.bfloat16)
    got_next = torch.zeros(n, dtype=torch.bfloat16)
    ops = [
        dist.P2POp(dist.isend, make_input(torch.bfloat16, n, rank, 80), nxt),
        dist.P2POp(dist.irecv, got_prev, prv),
        dist.P2POp(dist.isend, make_input(torch.bfloat16, n, rank, 81), prv),
        dist.P2POp(dist.irecv, got_next, nxt),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    problems = []
    for what, got, expected in (
        ("from previous", got_prev, make_input(torch.bfloat16, n, prv, 80)),
        ("from next", got_next, make_input(torch.bfloat16, n, nxt, 81)),
    ):
        m = mismatch(f"batch_isend_irecv {what}", got, expected)
        if m:
            problems.append(m)
    return problems


def _groups(ctx):
    """Two overlapping sub-groups (dlop and Gloo), made once per cluster."""
    import torch.distributed as dist

    if "groups" not in ctx.state:
        world = ctx.world_size
        a = [0, 2] if world >= 3 else [0]
        b = [1, 2, 3] if world >= 4 else ([1, 2] if world >= 3 else [world - 1])
        ctx.state["groups"] = {
            "a": (a, dist.new_group(a), dist.new_group(a, backend="gloo")),
            "b": (b, dist.new_group(b), dist.new_group(b, backend="gloo")),
            # Every rank, in reverse order: torch orders group ranks as given? (It sorts them.)
            "all": (list(range(world)), dist.new_group(list(range(world))[::-1]), ctx.gloo),
        }
    return ctx.state["groups"]


def rank_subgroups(ctx) -> list[str]:
    import torch
    import torch.distributed as dist

    rank = ctx.rank
    problems = []
    for name, (ranks, dgroup, ggroup) in _groups(ctx).items():
        if rank not in ranks:
            continue
        k = len(ranks)
        me = dist.get_group_rank(dgroup, rank)
        if me != sorted(ranks).index(rank) or dist.get_world_size(dgroup) != k:
            problems.append(f"group {name}: group rank {me}, size {dist.get_world_size(dgroup)}")
        for n in (0, 1, 7, 1000):
            for gname, g in (("dlop", dgroup), ("gloo", ggroup)):
                x = make_input(torch.float64, n, rank, 90)
                dist.all_reduce(x, group=g)
                m = mismatch(
                    f"group {name} ({gname}) all_reduce n={n}",
                    x,
                    sum(make_input(torch.float64, n, r, 90) for r in ranks) if n else torch.zeros(0, dtype=torch.float64),
                    exact=False,
                )
                if m:
                    problems.append(m)
                for src in ranks:
                    y = make_input(torch.int64, n, rank, 91)
                    dist.broadcast(y, src=src, group=g)
                    m = mismatch(f"group {name} ({gname}) broadcast from global {src}", y, make_input(torch.int64, n, src, 91))
                    if m:
                        problems.append(m)
                outs = [torch.zeros(n, dtype=torch.uint8) for _ in range(k)]
                dist.all_gather(outs, make_input(torch.uint8, n, rank, 92), group=g)
                for i, r in enumerate(sorted(ranks)):
                    m = mismatch(f"group {name} ({gname}) all_gather from {r}", outs[i], make_input(torch.uint8, n, r, 92))
                    if m:
                        problems.append(m)
                if k > 1:
                    pos = sorted(ranks).index(rank)
                    nxt, prv = sorted(ranks)[(pos + 1) % k], sorted(ranks)[(pos - 1) % k]
                    got = torch.zeros(n)
                    works = [dist.irecv(got, src=prv, group=g), dist.isend(make_input(torch.float32, n, rank, 93), dst=nxt, group=g)]
                    for w in works:
                        w.wait()
                    m = mismatch(f"group {name} ({gname}) send/recv (global ranks)", got, make_input(torch.float32, n, prv, 93))
                    if m:
                        problems.append(m)
            dist.barrier(group=dgroup)
    return problems


def rank_overlapping_async(ctx) -> list[str]:
    """Ranks in both sub-groups issue async all-reduces on both, interleaved, then wait in reverse."""
    import torch
    import torch.distributed as dist

    rank = ctx.rank
    groups = _groups(ctx)
    pending = []
    for i in range(6):
        for name in ("a", "b", "all"):
            ranks, dgroup, _ = groups[name]
            if rank not in ranks:
                continue
            x = make_input(torch.float32, 257, rank, 100 + i)
            pending.append((name, i, ranks, x, dist.all_reduce(x, group=dgroup, async_op=True)))
    problems = []
    for name, i, ranks, x, work in reversed(pending):
        work.wait()
        expected = sum(make_input(torch.float32, 257, r, 100 + i) for r in ranks)
        m = mismatch(f"async all_reduce {i} on group {name}", x, expected, exact=False)
        if m:
            problems.append(m)
    return problems


def rank_group_not_member(ctx):
    """A rank outside a group gets GroupMember.NON_GROUP_MEMBER and its calls are no-ops, as with Gloo."""
    import torch
    import torch.distributed as dist

    ranks, dgroup, _ = _groups(ctx)["a"]
    if ctx.rank in ranks:
        return None
    x = torch.ones(3)
    return dgroup == dist.GroupMember.NON_GROUP_MEMBER, dist.all_reduce(x, group=dgroup), x.tolist()


def rank_many_groups(ctx, count: int) -> list[str]:
    """count groups over every rank made, used and destroyed one after another."""
    import torch
    import torch.distributed as dist

    problems = []
    for i in range(count):
        g = dist.new_group(list(range(ctx.world_size)))
        x = torch.full((3,), float(ctx.rank + i))
        dist.all_reduce(x, group=g)
        expected = float(sum(range(ctx.world_size)) + i * ctx.world_size)
        if x.tolist() != [expected] * 3:
            problems.append(f"group {i}: {x.tolist()} != {expected}")
        dist.destroy_process_group(g)
    return problems


# ---------------------------------------------------------------------------
# Tests.


def test_send_recv(cluster):
    _need(cluster, 2)
    check(cluster, rank_send_recv, DTYPES, (0, 1, 7, 4099))


def test_send_recv_same_on_gloo(cluster):
    _need(cluster, 2)
    check(cluster, rank_send_recv, ("float32", "int64"), (1, 7), use_gloo=True)


def test_send_recv_16mib(cluster):
    if cluster.world_size not in (2, 4):
        pytest.skip("16 MiB runs on 2 and 4 ranks")
    check(cluster, rank_send_recv, ("float32",), ((16 << 20) // 4,))


def test_recv_any_source(cluster):
    _need(cluster, 2)
    check(cluster, rank_recv_any_source)


def test_tags_match_out_of_order(cluster):
    _need(cluster, 2)
    check(cluster, rank_tags)


@pytest.mark.parametrize("n", (0, 1, 7, 100_000))
def test_isend_irecv_all_pairs(cluster, n):
    _need(cluster, 2)
    check(cluster, rank_isend_irecv_all_pairs, n)


@pytest.mark.parametrize("n", (0, 9, 70_000))
def test_batch_isend_irecv(cluster, n):
    _need(cluster, 2)
    check(cluster, rank_batch_isend_irecv, n)


def test_subgroups(cluster):
    check(cluster, rank_subgroups)


def test_overlapping_groups_async(cluster):
    check(cluster, rank_overlapping_async)


def test_non_member_calls_are_no_ops(cluster):
    _need(cluster, 2)
    for result in cluster.run(rank_group_not_member):
        if result is not None:
            is_non_member, work, values = result
            assert is_non_member and work is None and values == [1.0, 1.0, 1.0], result


def test_groups_made_and_destroyed_in_turn(cluster):
    check(cluster, rank_many_groups, 8)
