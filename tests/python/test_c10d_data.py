"""Operations that only move data, on backend "dlop" against Gloo and the expected bytes.

broadcast, all_gather (even and uneven), all_gather_into_tensor and its
coalesced form, all_gather_coalesced, gather, scatter, all_to_all,
all_to_all_single (with and without split sizes) and barrier; world sizes 1
to 4, every dtype (complex included), sizes 0, 1, odd and 16 MiB, contiguous
and not (a non-contiguous tensor must give the contiguous result and leave
the memory around it alone). Results must be bit-exact; where Gloo refuses a
call the expected result is computed here (every rank's input is a function
of rank and seed).
"""

from __future__ import annotations

import pytest

from c10d_harness import DTYPE_NAMES, check, attempt, dtype_of, make_input, mismatch, non_contiguous_like, shared_cluster

pytestmark = pytest.mark.long_file(seconds=45)  # handed out first (conftest.py)

WORLDS = (1, 2, 3, 4)
DTYPES = DTYPE_NAMES + ("complex64", "int8", "int32")
SIZES = (0, 1, 7, 4099)


@pytest.fixture(scope="module", params=WORLDS, ids=lambda n: f"world{n}")
def cluster(request):
    return shared_cluster(request.param)


# ---------------------------------------------------------------------------
# On the ranks.


class Buffers:
    """Output tensors, contiguous or non-contiguous views whose surroundings are checked afterwards."""

    def __init__(self, non_contiguous: bool):
        self.non_contiguous = non_contiguous
        self.views: list = []  # (view, base, sentinel copy)

    def out(self, shape, dtype):
        import torch

        t = torch.full(shape, 3, dtype=dtype) if dtype != torch.bool else torch.zeros(shape, dtype=dtype)
        return self.wrap(t)

    def wrap(self, t):
        if not self.non_contiguous:
            return t
        view, base = non_contiguous_like(t)
        self.views.append((view, base, base[..., 1].clone()))
        return view

    def outside_untouched(self) -> bool:
        return all(base[..., 1].equal(sentinel) for _, base, sentinel in self.views)


def _compare(what, got, expected, problems):
    m = mismatch(what, got.contiguous(), expected.contiguous())
    if m:
        problems.append(m)


def _run_both(ctx, what, call, expected, problems, non_contiguous):
    """call(group, bufs) -> list of result tensors on dlop and Gloo; compares with expected (a list)."""
    bufs = Buffers(non_contiguous)
    got, err = attempt(lambda: call(None, bufs))
    if err is not None:
        problems.append(f"{what}: dlop raised {type(err).__name__}: {str(err)[:400]}")
        return
    if not bufs.outside_untouched():
        problems.append(f"{what}: wrote outside its non-contiguous outputs")
    gloo, gerr = attempt(lambda: call(ctx.gloo, Buffers(False)))
    for i, (g, e) in enumerate(zip(got, expected)):
        _compare(f"{what} [{i}]", g, e, problems)
        if gerr is None:
            _compare(f"{what} [{i}] vs Gloo", g, gloo[i], problems)


def rank_data(ctx, op: str, dtypes, sizes, non_contiguous: bool = False) -> list[str]:
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager

    world, rank = ctx.world_size, ctx.rank
    problems: list[str] = []

    def inp(dtype, n, r, seed=0, bufs=None):
        t = make_input(dtype, n, r, seed)
        return bufs.wrap(t) if (bufs is not None and non_contiguous) else t

    for dn in dtypes:
        dtype = dtype_of(dn)
        for n in sizes:
            tag = f"{op} {dn} n={n}{' non-contiguous' if non_contiguous else ''}"
            if op == "broadcast":
                for root in range(world):

                    def call(group, bufs, root=root):
                        t = bufs.wrap(make_input(dtype, n, rank, 1))
                        dist.broadcast(t, src=root, group=group)
                        return [t]

                    _run_both(ctx, f"{tag} root={root}", call, [make_input(dtype, n, root, 1)], problems, non_contiguous)
            elif op in ("all_gather", "all_gather_uneven"):
                counts = [n + (r if op == "all_gather_uneven" else 0) for r in range(world)]

                def call(group, bufs):
                    outs = [bufs.out((counts[r],), dtype) for r in range(world)]
                    dist.all_gather(outs, inp(dtype, counts[rank], rank, 2, bufs), group=group)
                    return outs

                _run_both(ctx, tag, call, [make_input(dtype, counts[r], r, 2) for r in range(world)], problems, non_contiguous)
            elif op == "all_gather_into_tensor":
                for stacked in (False, True):

                    def call(group, bufs, stacked=stacked):
                        out = bufs.out((world, n) if stacked else (world * n,), dtype)
                        dist.all_gather_into_tensor(out, inp(dtype, n, rank, 3, bufs), group=group)
                        return [out.reshape(-1)]

                    expected = torch.cat([make_input(dtype, n, r, 3) for r in range(world)])
                    _run_both(ctx, f"{tag} stacked={stacked}", call, [expected], problems, non_contiguous)
            elif op == "all_gather_into_tensor_coalesced":
                shapes = (n, 1, 0, 5)

                def call(group, bufs):
                    outs = [bufs.out((world * s,), dtype) for s in shapes]
                    ins = [inp(dtype, s, rank, 4 + i, bufs) for i, s in enumerate(shapes)]
                    with _coalescing_manager(group=group):
                        for o, i in zip(outs, ins):
                            dist.all_gather_into_tensor(o, i, group=group)
                    return outs

                expected = [torch.cat([make_input(dtype, s, r, 4 + i) for r in range(world)]) for i, s in enumerate(shapes)]
                _run_both(ctx, tag, call, expected, problems, non_contiguous)
            elif op == "all_gather_coalesced":
                shapes = (n, 3, 0)

                def call(group, bufs):
                    outs = [[bufs.out((s,), dtype) for s in shapes] for _ in range(world)]
                    ins = [inp(dtype, s, rank, 8 + i, bufs) for i, s in enumerate(shapes)]
                    dist.all_gather_coalesced(outs, ins, group=group)
                    return [t for lst in outs for t in lst]

                expected = [make_input(dtype, s, r, 8 + i) for r in range(world) for i, s in enumerate(shapes)]
                _run_both(ctx, tag, call, expected, problems, non_contiguous)
            elif op == "gather":
                for root in range(world):

                    def call(group, bufs, root=root):
                        outs = [bufs.out((n,), dtype) for _ in range(world)] if rank == root else None
                        dist.gather(inp(dtype, n, rank, 12, bufs), outs, dst=root, group=group)
                        return outs or []

                    expected = [make_input(dtype, n, r, 12) for r in range(world)] if rank == root else []
                    _run_both(ctx, f"{tag} root={root}", call, expected, problems, non_contiguous)
            elif op == "scatter":
                for root in range(world):

                    def call(group, bufs, root=root):
                        out = bufs.out((n,), dtype)
                        chunks = [inp(dtype, n, root, 20 + k, bufs) for k in range(world)] if rank == root else None
                        dist.scatter(out, chunks, src=root, group=group)
                        return [out]

                    _run_both(ctx, f"{tag} root={root}", call, [make_input(dtype, n, root, 20 + rank)], problems, non_contiguous)
            elif op == "all_to_all":
                # Rank s sends rank d a tensor of n + s + 2d elements (uneven in both directions).
                def size(s, d):
                    return n + s + 2 * d if n else 0

                def call(group, bufs):
                    ins = [inp(dtype, size(rank, d), rank, 30 + d, bufs) for d in range(world)]
                    outs = [bufs.out((size(s, rank),), dtype) for s in range(world)]
                    dist.all_to_all(outs, ins, group=group)
                    return outs

                expected = [make_input(dtype, size(s, rank), s, 30 + rank) for s in range(world)]
                _run_both(ctx, tag, call, expected, problems, non_contiguous)
            elif op in ("all_to_all_single", "all_to_all_single_splits"):
                cols = 3
                if op == "all_to_all_single":
                    rows = [[n] * world for _ in range(world)]  # rows[s][d]: rows s sends d
                else:
                    rows = [[(n + s + 2 * d) % 5 if n else 0 for d in range(world)] for s in range(world)]

                def call(group, bufs):
                    # Row i of sender s's block for d holds make_input(s, seed 40+d) reshaped.
                    blocks = [make_input(dtype, rows[rank][d] * cols, rank, 40 + d).reshape(-1, cols) for d in range(world)]
                    src = torch.cat(blocks) if blocks else torch.empty(0, cols, dtype=dtype)
                    src = bufs.wrap(src) if non_contiguous else src
                    out = bufs.out((sum(rows[s][rank] for s in range(world)), cols), dtype)
                    if op == "all_to_all_single":
                        dist.all_to_all_single(out, src, group=group)
                    else:
                        dist.all_to_all_single(
                            out,
                            src,
                            output_split_sizes=[rows[s][rank] for s in range(world)],
                            input_split_sizes=rows[rank],
                            group=group,
                        )
                    return [out]

                expected = torch.cat(
                    [make_input(dtype, rows[s][rank] * cols, s, 40 + rank).reshape(-1, cols) for s in range(world)]
                )
                _run_both(ctx, tag, call, [expected], problems, non_contiguous)
            else:
                raise ValueError(op)
    return problems


def rank_big(ctx, op: str) -> list[str]:
    """op on 16 MiB of float32 (all_gather_into_tensor: 16 MiB of output)."""
    import torch

    world = ctx.world_size
    numel = (16 << 20) // 4
    if op in ("all_gather_into_tensor", "all_to_all_single"):
        numel //= world
    if op == "all_to_all_single":
        numel -= numel % world
    return rank_data(ctx, op, ("float32",), (numel,))


def rank_barrier(ctx, rounds: int) -> float:
    import time

    import torch.distributed as dist

    t = time.monotonic()
    for _ in range(rounds):
        dist.barrier()
        w = dist.barrier(async_op=True)
        w.wait()
    return time.monotonic() - t


def rank_barrier_waits_for_everyone(ctx) -> float:
    """The last rank arrives 1.5 s late: nobody may leave the barrier before it arrives."""
    import time

    import torch.distributed as dist

    dist.barrier()
    if ctx.rank == ctx.world_size - 1:
        time.sleep(1.5)
    t = time.monotonic()
    dist.barrier()
    return time.monotonic() - t


# ---------------------------------------------------------------------------
# Tests.

OPS = (
    "broadcast",
    "all_gather",
    "all_gather_uneven",
    "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced",
    "all_gather_coalesced",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "all_to_all_single_splits",
)


@pytest.mark.parametrize("op", OPS)
def test_data_movement(cluster, op):
    check(cluster, rank_data, op, DTYPES + ("complex128",), SIZES)


@pytest.mark.parametrize("op", OPS)
def test_data_movement_non_contiguous(cluster, op):
    check(cluster, rank_data, op, ("float32", "bool", "complex64", "int64"), (1, 7, 513), non_contiguous=True)


@pytest.mark.parametrize("op", ("broadcast", "all_gather_into_tensor", "all_to_all_single"))
def test_data_movement_16mib(cluster, op):
    if cluster.world_size in (1, 3):
        pytest.skip("16 MiB runs on 2 and 4 ranks")
    check(cluster, rank_big, op)


def test_barrier(cluster):
    cluster.run(rank_barrier, 20)


def test_barrier_waits_for_the_last_rank(cluster):
    if cluster.world_size == 1:
        pytest.skip("needs 2 ranks")
    waited = cluster.run(rank_barrier_waits_for_everyone)
    assert all(w > 1.0 for w in waited[:-1]), f"ranks left the barrier early: waited {waited}"
