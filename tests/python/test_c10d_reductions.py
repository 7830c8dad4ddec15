"""Reductions on backend "dlop" against the same call through a Gloo group.

Every ReduceOp (AVG and PREMUL_SUM included) with all_reduce, reduce (every
root), reduce_scatter, reduce_scatter_tensor and the coalesced forms, world
sizes 1 to 4, dtypes float32/float64/float16/bfloat16/int64/uint8/bool and
complex, sizes 0, 1, odd and 16 MiB. Integers and MIN/MAX compare exactly,
float sums and products within the dtype's tolerance. Where Gloo refuses a
pair (AVG on integers, PREMUL_SUM, bool products, ...) the reference is the
reduction computed here from every rank's input (each rank can compute what
the others sent: inputs are a function of rank and seed). Where neither
defines the reduction (bitwise ops on floats) dlop must raise ValueError or
RuntimeError naming it.
"""

from __future__ import annotations

import functools

import pytest

from c10d_harness import (
    check,
    DTYPE_NAMES,
    SIZES,
    attempt,
    dtype_of,
    make_input,
    mismatch,
    non_contiguous_like,
    shared_cluster,
)

pytestmark = pytest.mark.long_file(seconds=70)  # handed out first (conftest.py)

REDOPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")
WORLDS = (1, 2, 3, 4)
COMPLEX = ("complex64", "complex128")
PREMUL_FACTOR = 0.5  # exact in every float dtype; integer dtypes get 3


@pytest.fixture(scope="module", params=WORLDS, ids=lambda n: f"world{n}")
def cluster(request):
    return shared_cluster(request.param)


# ---------------------------------------------------------------------------
# On the ranks.


def _factor(dtype):
    import torch

    return PREMUL_FACTOR if (dtype.is_floating_point or dtype.is_complex) else 3


def _torch_op(name: str, dtype, tensor_factor: bool = False):
    import torch
    import torch.distributed as dist

    if name == "PREMUL_SUM":
        f = _factor(dtype)
        return dist._make_nccl_premul_sum(torch.tensor(float(f), dtype=torch.float64) if tensor_factor else float(f))
    return getattr(dist.ReduceOp, name)


def _dtype_ops(name: str, dtypes, tensor_factor: bool = False):
    """(dtype name, dtype, op) for each of dtypes the reduction `name` applies to: on complex dtypes only sums,
    as torch refuses the others before any backend sees them."""
    for dn in dtypes:
        dtype = dtype_of(dn)
        if dtype.is_complex and name not in ("SUM", "AVG", "PREMUL_SUM"):
            continue
        yield dn, dtype, _torch_op(name, dtype, tensor_factor)


def _kind(name: str) -> str:
    return "prod" if name == "PRODUCT" else "any"


def expected_reduction(name: str, xs: list, world: int):
    """The reduction of xs (every rank's tensor, in rank order), or None where it is not defined."""
    import torch

    dtype = xs[0].dtype
    if name == "PREMUL_SUM":
        f = torch.scalar_tensor(_factor(dtype), dtype=dtype)
        xs = [x * f for x in xs]
        name = "SUM"
    if dtype == torch.bool:
        st = torch.stack(xs)
        if name in ("SUM", "AVG", "MAX", "BOR"):
            return st.any(0)
        if name in ("PRODUCT", "MIN", "BAND"):
            return st.all(0)
        return (st.sum(0) % 2).bool()  # BXOR
    if dtype.is_floating_point or dtype.is_complex:
        wide = torch.complex128 if dtype.is_complex else torch.float64
        st = torch.stack([x.to(wide) for x in xs])
        if name == "SUM":
            return st.sum(0).to(dtype)
        if name == "AVG":
            return (st.sum(0) / world).to(dtype)
        if dtype.is_complex:
            return None
        if name == "PRODUCT":
            return st.prod(0).to(dtype)
        if name == "MIN":
            return st.amin(0).to(dtype)
        if name == "MAX":
            return st.amax(0).to(dtype)
        return None  # bitwise on floats
    st = torch.stack([x.to(torch.int64) for x in xs])
    if name == "SUM":
        return st.sum(0).to(dtype)  # wraps around as the dtype does
    if name == "AVG":
        # Sum in the dtype (wrapping), then divide rounding toward zero (C, NCCL).
        return torch.div(st.sum(0).to(dtype).to(torch.int64), world, rounding_mode="trunc").to(dtype)
    if name == "PRODUCT":
        return st.prod(0).to(dtype)
    if name == "MIN":
        return st.amin(0).to(dtype)
    if name == "MAX":
        return st.amax(0).to(dtype)
    bit = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[name]
    return functools.reduce(bit, [x for x in xs])


def _exact(name: str, dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex) or name in ("MIN", "MAX")


def judge(what: str, name: str, got, got_err, gloo, gloo_err, expected, world: int = 1) -> list[str]:
    """Problems with dlop's outcome (got or got_err) given Gloo's and the computed reference."""
    if got_err is not None:
        if expected is None and (gloo_err is not None or gloo is None):
            if isinstance(got_err, (ValueError, RuntimeError)) and str(got_err):
                return []
            return [f"{what}: raised {type(got_err).__name__} (not ValueError/RuntimeError): {got_err}"]
        return [f"{what}: dlop raised {type(got_err).__name__}: {str(got_err)[:300]} (Gloo: {gloo_err or 'ok'})"]
    if expected is None and gloo_err is not None:
        return [f"{what}: dlop returned a result where the reduction is undefined (Gloo: {gloo_err})"]
    dtype = got.dtype
    exact = _exact(name, dtype)
    problems = []
    if gloo_err is None and gloo is not None:
        # Float sums of 3+ ranks may differ from Gloo's in the order of
        # additions; ints, MIN/MAX and world sizes 1-2 (one addition) are exact.
        m = mismatch(f"{what} vs Gloo", got, gloo, exact=exact or (world <= 2 and name != "AVG"))
        if m:
            problems.append(m)
    if expected is not None:
        m = mismatch(f"{what} vs reference", got, expected, exact=exact)
        if m:
            problems.append(m)
    return problems


def _inputs(ctx, dtype, n, seed, name):
    return [make_input(dtype, n, r, seed, _kind(name)) for r in range(ctx.world_size)]


def rank_all_reduce(ctx, name: str, dtypes, sizes, tensor_factor=False, non_contiguous=False) -> list[str]:
    import torch.distributed as dist

    problems = []
    for dn, dtype, op in _dtype_ops(name, dtypes, tensor_factor):
        for n in sizes:
            xs = _inputs(ctx, dtype, n, 1, name)
            mine = xs[ctx.rank]

            def dlop_call(t=mine):
                if non_contiguous:
                    view, base = non_contiguous_like(t)
                    sentinel = base[..., 1].clone()
                    dist.all_reduce(view, op=op)
                    assert base[..., 1].equal(sentinel), "all_reduce wrote outside the non-contiguous view"
                    return view.contiguous()
                out = t.clone()
                dist.all_reduce(out, op=op)
                return out

            def gloo_call(t=mine):
                out = t.clone()
                dist.all_reduce(out, op=op, group=ctx.gloo)
                return out

            got, err = attempt(dlop_call)
            gloo, gerr = attempt(gloo_call)
            expected = expected_reduction(name, xs, ctx.world_size)
            problems += judge(f"all_reduce {name} {dn} n={n}", name, got, err, gloo, gerr, expected, ctx.world_size)
    return problems


def rank_reduce(ctx, name: str, dtypes, sizes) -> list[str]:
    import torch.distributed as dist

    problems = []
    for dn, dtype, op in _dtype_ops(name, dtypes):
        for n in sizes:
            xs = _inputs(ctx, dtype, n, 2, name)
            for root in range(ctx.world_size):
                mine = xs[ctx.rank]

                def call(group, t=mine, root=root):
                    out = t.clone()
                    dist.reduce(out, dst=root, op=op, group=group)
                    return out

                got, err = attempt(lambda: call(None))
                gloo, gerr = attempt(lambda: call(ctx.gloo))
                if ctx.rank != root:
                    if err is not None and gerr is None:
                        problems.append(f"reduce {name} {dn} n={n} root={root}: non-root raised {err}")
                    continue
                expected = expected_reduction(name, xs, ctx.world_size)
                problems += judge(
                    f"reduce {name} {dn} n={n} root={root}", name, got, err, gloo, gerr, expected, ctx.world_size
                )
    return problems


def rank_reduce_scatter(ctx, name: str, dtypes, sizes, form: str) -> list[str]:
    """form: "list" (reduce_scatter), "tensor" (reduce_scatter_tensor), "uneven" (list, chunk r of size r + n)."""
    import torch
    import torch.distributed as dist

    world, rank = ctx.world_size, ctx.rank
    problems = []
    for dn, dtype, op in _dtype_ops(name, dtypes):
        for n in sizes:
            counts = [n + (k if form == "uneven" else 0) for k in range(world)]
            # chunks[r][k]: rank r's contribution to rank k.
            chunks = [[make_input(dtype, counts[k], r, 10 + k, _kind(name)) for k in range(world)] for r in range(world)]

            def call(group, mine=chunks[rank]):
                out = torch.empty(counts[rank], dtype=dtype)
                if form == "tensor":
                    dist.reduce_scatter_tensor(out, torch.cat(mine), op=op, group=group)
                else:
                    dist.reduce_scatter(out, [c.clone() for c in mine], op=op, group=group)
                return out

            got, err = attempt(lambda: call(None))
            gloo, gerr = attempt(lambda: call(ctx.gloo))
            expected = expected_reduction(name, [chunks[r][rank] for r in range(world)], world)
            problems += judge(f"reduce_scatter[{form}] {name} {dn} n={n}", name, got, err, gloo, gerr, expected, world)
    return problems


def rank_coalesced(ctx, name: str, dtypes, form: str) -> list[str]:
    """form: "all_reduce_coalesced", "cm_all_reduce", "cm_reduce_scatter_tensor" (_coalescing_manager)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager

    world, rank = ctx.world_size, ctx.rank
    problems = []
    sizes = (0, 1, 7, 300)
    for dn, dtype, op in _dtype_ops(name, dtypes):
        if form == "cm_reduce_scatter_tensor":
            ins = [[make_input(dtype, s * world, r, 20 + i, _kind(name)) for i, s in enumerate(sizes)] for r in range(world)]
            expected = [expected_reduction(name, [ins[r][i].narrow(0, rank * s, s) for r in range(world)], world) for i, s in enumerate(sizes)]
        else:
            ins = [[make_input(dtype, s, r, 20 + i, _kind(name)) for i, s in enumerate(sizes)] for r in range(world)]
            expected = [expected_reduction(name, [ins[r][i] for r in range(world)], world) for i in range(len(sizes))]

        def call(group):
            mine = [t.clone() for t in ins[rank]]
            if form == "all_reduce_coalesced":
                dist.all_reduce_coalesced(mine, op=op, group=group)
                return mine
            if form == "cm_all_reduce":
                with _coalescing_manager(group=group):
                    for t in mine:
                        dist.all_reduce(t, op=op, group=group)
                return mine
            outs = [torch.empty(s, dtype=dtype) for s in sizes]
            with _coalescing_manager(group=group):
                for o, t in zip(outs, mine):
                    dist.reduce_scatter_tensor(o, t, op=op, group=group)
            return outs

        got, err = attempt(lambda: call(None))
        gloo, gerr = attempt(lambda: call(ctx.gloo))
        for i, s in enumerate(sizes):
            problems += judge(
                f"{form} {name} {dn} tensor {i} (n={s})",
                name,
                None if err else got[i],
                err,
                None if gerr else gloo[i],
                gerr,
                expected[i],
                world,
            )
            if err is not None:
                break
    return problems


# ---------------------------------------------------------------------------
# Tests.


@pytest.mark.parametrize("op", REDOPS)
def test_all_reduce(cluster, op):
    check(cluster, rank_all_reduce, op, DTYPE_NAMES + COMPLEX, SIZES)


def test_all_reduce_premul_sum_tensor_factor(cluster):
    check(cluster, rank_all_reduce, "PREMUL_SUM", ("float32", "float64", "float16", "bfloat16", "complex64"), SIZES, tensor_factor=True)


@pytest.mark.parametrize("op", ("SUM", "AVG", "MAX", "BXOR", "PREMUL_SUM"))
def test_all_reduce_non_contiguous(cluster, op):
    check(cluster, rank_all_reduce, op, DTYPE_NAMES + COMPLEX, (1, 7, 4099), non_contiguous=True)


@pytest.mark.parametrize("op", REDOPS)
def test_reduce(cluster, op):
    check(cluster, rank_reduce, op, DTYPE_NAMES + COMPLEX, (0, 1, 7, 1031))


@pytest.mark.parametrize("form", ("list", "tensor", "uneven"))
@pytest.mark.parametrize("op", REDOPS)
def test_reduce_scatter(cluster, op, form):
    check(cluster, rank_reduce_scatter, op, DTYPE_NAMES + COMPLEX, (0, 1, 7, 1031), form)


@pytest.mark.parametrize("form", ("all_reduce_coalesced", "cm_all_reduce", "cm_reduce_scatter_tensor"))
@pytest.mark.parametrize("op", REDOPS)
def test_coalesced_reductions(cluster, op, form):
    check(cluster, rank_coalesced, op, DTYPE_NAMES + COMPLEX, form)


@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "int64"))
def test_all_reduce_16mib(cluster, dtype):
    if cluster.world_size == 3:
        pytest.skip("16 MiB runs on 1, 2 and 4 ranks")
    numel = (16 << 20) // dtype_of(dtype).itemsize
    check(cluster, rank_all_reduce, "SUM", (dtype,), (numel,))


def test_reduce_scatter_tensor_16mib(cluster):
    if cluster.world_size in (1, 3):
        pytest.skip("16 MiB runs on 2 and 4 ranks")
    numel = (16 << 20) // 4 // cluster.world_size
    check(cluster, rank_reduce_scatter, "AVG", ("float32",), (numel,), "tensor")


# ---------------------------------------------------------------------------
# Sparse all-reduce (SUM only, as Gloo): the summed sparse tensor in place.

SPARSE_CASES = ("empty", "one", "duplicates", "ragged", "two_sparse_dims", "dense_dims", "large")


def _sparse_input(case: str, rank: int, dtype):
    """Rank's input for a case: a function of (case, rank) only, so every rank can build everyone's."""
    import torch

    g = torch.Generator().manual_seed(100 * SPARSE_CASES.index(case) + rank)

    def values(*shape):  # small integers: every sum is exact in every dtype
        return torch.randint(-9, 10, shape, generator=g).to(dtype)

    def coo(indices, vals, size):
        return torch.sparse_coo_tensor(torch.tensor(indices, dtype=torch.long).reshape(len(size) - vals.dim() + 1, -1),
                                       vals, size)

    if case == "empty":  # no rank has an entry
        return torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), values(0), (5,))
    if case == "one":
        return coo([rank % 5], values(1), (5,))
    if case == "duplicates":  # uncoalesced: index 1 twice here, and every rank has index 3
        return coo([1, 1, 3, rank % 5], values(4), (5,))
    if case == "ragged":  # rank r has r entries: rank 0 none
        return coo(torch.randint(0, 7, (rank,), generator=g).tolist(), values(rank), (7,))
    if case == "two_sparse_dims":
        nnz = 3 + rank
        return torch.sparse_coo_tensor(torch.stack([torch.randint(0, 4, (nnz,), generator=g),
                                                    torch.randint(0, 6, (nnz,), generator=g)]), values(nnz), (4, 6))
    if case == "dense_dims":  # sparse rows of 3 x 2 dense blocks
        nnz = 2 + rank
        return torch.sparse_coo_tensor(torch.randint(0, 5, (1, nnz), generator=g), values(nnz, 3, 2), (5, 3, 2))
    if case == "large":
        nnz = 3000 + 17 * rank
        return torch.sparse_coo_tensor(torch.randint(0, 1000, (1, nnz), generator=g), values(nnz, 16), (1000, 16))
    raise ValueError(case)


def rank_sparse_all_reduce(ctx, dtype_name: str) -> list[str]:
    import torch
    import torch.distributed as dist

    dtype = dtype_of(dtype_name)
    problems = []
    for case in SPARSE_CASES:
        inputs = [_sparse_input(case, r, dtype) for r in range(ctx.world_size)]
        expected = sum(x.to_dense() for x in inputs)
        mine = inputs[ctx.rank].clone()
        gloo = inputs[ctx.rank].clone()
        err = attempt(lambda: dist.all_reduce(mine))[1]
        gloo_err = attempt(lambda: dist.all_reduce(gloo, group=ctx.gloo))[1]
        what = f"sparse all_reduce {case} {dtype_name}"
        if err is not None or gloo_err is not None:
            problems.append(f"{what}: dlop raised {err!r}, Gloo {gloo_err!r}")
            continue
        if not mine.is_sparse or mine.shape != expected.shape:
            problems.append(f"{what}: result is {mine.layout} of shape {tuple(mine.shape)}")
            continue
        for m in (mismatch(f"{what} vs reference", mine.to_dense(), expected),
                  mismatch(f"{what} vs Gloo", mine.to_dense(), gloo.to_dense())):
            if m:
                problems.append(m)
    return problems


@pytest.mark.parametrize("dtype", ("float32", "float64", "int64"))
def test_sparse_all_reduce(cluster, dtype):
    check(cluster, rank_sparse_all_reduce, dtype)
