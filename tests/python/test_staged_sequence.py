"""A call on accelerator tensors counts as one collective of its group, staged or not, on dlop_test.

TORCH_DISTRIBUTED_DEBUG=DETAIL compares a group's sequence number
(ProcessGroup._get_sequence_number_for_group) across the ranks before every
collective, and users read it to line ranks up: it counts the collectives
issued, one per call. A staged call runs its host half through dlop's host
entry, never through the public op again, so a large tensor staged in
several chunks, or reduced in shared device memory in several slots, still
counts once, as the same call on CPU tensors does; point-to-point calls
count nothing. Every result is exact against a reference made from every
rank's inputs.

Groups: staged on one device per rank (2 ranks); staged with 3 ranks where
ranks 0 and 2 share device 0; reduced in shared device memory (auto, every
rank on dlop_test:0, slots of 4 KiB).
"""

from __future__ import annotations

import pytest
from c10d_harness import Cluster, Setup, check

pytest.importorskip("dlop.testing.accelerator", reason="dlop.testing._accelerator is not built")

# 2 MiB of float32 a rank: four chunks of 512 KiB of an all-reduce or a broadcast (staged_ops.cpp: chunk_bytes),
# each over the host all-reduce's shm limit (256 KiB, collectives' tuning table) as 12 MiB's chunks are.
LARGE = (2 << 20) // 4
SIZES = {"0": 0, "1": 1, "odd": 1001, "large": LARGE}
GROUPS = {
    "staged-2ranks": (2, {"DLOP_DEVICE_BACKEND": "staged"}),
    "staged-3ranks-shared-device": (3, {"DLOP_DEVICE_BACKEND": "staged"}),
    "shared-device-memory": (2, {"DLOP_DEVICE_BACKEND": "auto", "DLOP_TEST_DEVICE_COUNT": "1",
                                 "DLOP_SHARED_DEVICE_BYTES": "4096"}),
}


@pytest.fixture(scope="module", params=list(GROUPS))
def cluster(request):
    ranks, env = GROUPS[request.param]
    c = Cluster(ranks, Setup(gloo=False, imports=("dlop.testing.accelerator",),
                             env={"DLOP_TEST_DEVICE_DELAY_US": "500", **env}))
    yield c
    c.close()


def _value(rank: int, n: int, salt: int = 0):
    """Small integers: exact in float32 and in sums of a few of them."""
    import torch

    return ((torch.arange(n, dtype=torch.int32) * 7 + rank * 13 + salt * 5) % 17 - 8).to(torch.float32)


def rank_each_call_counts_once(ctx, n: int) -> list[str]:
    import torch
    import torch.distributed as dist

    size, rank = ctx.world_size, ctx.rank
    device = torch.device("dlop_test", rank % torch.dlop_test.device_count())
    pg = dist.group.WORLD._get_backend(device)
    problems: list[str] = []
    val = lambda r, m=n, salt=0: _value(r, m, salt)  # noqa: E731
    dev = lambda cpu: cpu.to(device)  # noqa: E731
    total = lambda parts: torch.stack(parts).sum(0) if parts[0].numel() else parts[0]  # noqa: E731

    def counted(what, call, expected_calls=1):
        before = pg._get_sequence_number_for_group()
        call()
        got = pg._get_sequence_number_for_group() - before
        if got != expected_calls:
            problems.append(f"{what} n={n}: the sequence number moved by {got}, expected {expected_calls}")

    def compare(what, got, expected):
        got = got.cpu()
        if got.shape != expected.shape or not torch.equal(got, expected):
            problems.append(f"{what} n={n}: {got.shape} {got.flatten()[:4]} != {expected.shape} "
                            f"{expected.flatten()[:4]}")

    t = dev(val(rank))
    counted("all_reduce", lambda: dist.all_reduce(t))
    compare("all_reduce", t, total([val(r) for r in range(size)]))

    t = dev(val(rank))
    counted("all_reduce async", lambda: dist.all_reduce(t, async_op=True).wait())
    compare("all_reduce async", t, total([val(r) for r in range(size)]))

    t = dev(val(rank))
    counted("broadcast", lambda: dist.broadcast(t, src=size - 1))
    compare("broadcast", t, val(size - 1))

    t = dev(val(rank))
    counted("reduce", lambda: dist.reduce(t, dst=0))
    if rank == 0:
        compare("reduce", t, total([val(r) for r in range(size)]))

    pair = [dev(val(rank)), dev(val(rank, 3, 1))]
    counted("all_reduce_coalesced", lambda: dist.all_reduce_coalesced(pair))
    compare("all_reduce_coalesced[0]", pair[0], total([val(r) for r in range(size)]))
    compare("all_reduce_coalesced[1]", pair[1], total([val(r, 3, 1) for r in range(size)]))

    outs = [dev(torch.zeros(n)) for _ in range(size)]
    counted("all_gather", lambda: dist.all_gather(outs, dev(val(rank))))
    for r in range(size):
        compare(f"all_gather[{r}]", outs[r], val(r))

    out = dev(torch.zeros(n * size))
    counted("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(out, dev(val(rank))))
    compare("all_gather_into_tensor", out, torch.cat([val(r) for r in range(size)]))

    out = dev(torch.zeros(n))
    counted("reduce_scatter", lambda: dist.reduce_scatter(out, [dev(val(rank, n, j)) for j in range(size)]))
    compare("reduce_scatter", out, total([val(r, n, rank) for r in range(size)]))

    out = dev(torch.zeros(n))
    counted("reduce_scatter_tensor",
            lambda: dist.reduce_scatter_tensor(out, dev(torch.cat([val(rank, n, j) for j in range(size)]))))
    compare("reduce_scatter_tensor", out, total([val(r, n, rank) for r in range(size)]))

    out = dev(torch.zeros(n * size))
    counted("all_to_all_single",
            lambda: dist.all_to_all_single(out, dev(torch.cat([val(rank, n, j) for j in range(size)]))))
    compare("all_to_all_single", out, torch.cat([val(r, n, rank) for r in range(size)]))

    outs = [dev(torch.zeros(n)) for _ in range(size)]
    counted("all_to_all", lambda: dist.all_to_all(outs, [dev(val(rank, n, j)) for j in range(size)]))
    for r in range(size):
        compare(f"all_to_all[{r}]", outs[r], val(r, n, rank))

    outs = [dev(torch.zeros(n)) for _ in range(size)] if rank == 0 else None
    counted("gather", lambda: dist.gather(dev(val(rank)), outs, dst=0))
    if rank == 0:
        for r in range(size):
            compare(f"gather[{r}]", outs[r], val(r))

    out = dev(torch.zeros(n))
    counted("scatter",
            lambda: dist.scatter(out, [dev(val(0, n, j)) for j in range(size)] if rank == 0 else None, src=0))
    compare("scatter", out, val(0, n, rank))

    out = dev(torch.zeros(n))

    def ring():
        sent = dist.isend(dev(val(rank)), (rank + 1) % size)
        dist.recv(out, (rank - 1) % size)
        sent.wait()

    counted("send/recv", ring, expected_calls=0)
    compare("send/recv", out, val((rank - 1) % size))

    # The same call on CPU tensors: the count the staged calls must match.
    counted("all_reduce on the CPU", lambda: dist.all_reduce(val(rank).clone()))
    return problems


@pytest.mark.parametrize("size", list(SIZES))
def test_each_staged_call_counts_once_and_is_exact(cluster, size):
    check(cluster, rank_each_call_counts_once, SIZES[size])
