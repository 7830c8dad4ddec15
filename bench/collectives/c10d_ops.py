"""The collectives that ``bench.c10d`` measures: buffers, one call, and the check.

Sizes follow nccl-tests: S is the bytes of one rank's buffer for all-reduce and
broadcast, and of the full array for all-gather (the output), reduce-scatter
(the input) and all-to-all (each rank's input). Timed buffers hold zeros (an
in-place sum of zeros stays finite however often it runs); the check runs once
per implementation on its own buffers filled with small integers, exact in
every dtype (bfloat16 included), so a wrong element is a real error.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

DTYPES = {
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
}


def _pattern(tag: int, count: int, dtype: torch.dtype, offset: int = 0, modulus: int = 11) -> torch.Tensor:
    """Element k is ((tag + offset + k) % modulus) + 1: small integers that a given (tag, offset) pins down."""
    index = torch.arange(offset, offset + count, dtype=torch.int64)
    return ((index + tag) % modulus + 1).to(dtype)


def _count_wrong(got: torch.Tensor, want: torch.Tensor) -> int:
    return int((got != want).sum().item())


class Case:
    """One collective at one size: its buffers (a rotation of zero-filled sets) and the call."""

    op = ""
    inplace = False
    redop = "-"
    root = "-"
    divisible = False  # the element count must be a multiple of the rank count

    def __init__(self, size: int, dtype: torch.dtype, ranks: int, rank: int, sets: int):
        element = torch.empty((), dtype=dtype).element_size()
        count = max(size // element, 1)
        if self.divisible:
            count = max(ranks, count - count % ranks)
        self.count, self.bytes, self.dtype, self.ranks, self.rank = count, count * element, dtype, ranks, rank
        self.sets = [self.buffers() for _ in range(sets)]

    def buffers(self) -> tuple:
        raise NotImplementedError

    def call(self, buffers: tuple, group) -> None:
        raise NotImplementedError

    def check(self, group) -> int:
        """Runs once on pattern-filled buffers; returns this rank's count of wrong elements."""
        raise NotImplementedError

    def busbw_factor(self) -> float:
        return (self.ranks - 1) / self.ranks


class AllReduce(Case):
    op, inplace, redop = "all_reduce", True, "sum"

    def buffers(self):
        return (torch.zeros(self.count, dtype=self.dtype),)

    def call(self, buffers, group):
        dist.all_reduce(buffers[0], group=group)

    def check(self, group):
        data = _pattern(self.rank, self.count, self.dtype, modulus=8)
        dist.all_reduce(data, group=group)
        want = torch.zeros(self.count, dtype=self.dtype)
        for source in range(self.ranks):
            want += _pattern(source, self.count, self.dtype, modulus=8)
        return _count_wrong(data, want)

    def busbw_factor(self):
        return 2 * (self.ranks - 1) / self.ranks


class AllGather(Case):
    op, divisible = "all_gather_into_tensor", True

    def buffers(self):
        part = self.count // self.ranks
        return torch.zeros(part, dtype=self.dtype), torch.zeros(self.count, dtype=self.dtype)

    def call(self, buffers, group):
        dist.all_gather_into_tensor(buffers[1], buffers[0], group=group)

    def check(self, group):
        part = self.count // self.ranks
        out = torch.zeros(self.count, dtype=self.dtype)
        dist.all_gather_into_tensor(out, _pattern(3 * self.rank, part, self.dtype), group=group)
        want = torch.cat([_pattern(3 * source, part, self.dtype) for source in range(self.ranks)])
        return _count_wrong(out, want)


class ReduceScatter(Case):
    op, redop, divisible = "reduce_scatter_tensor", "sum", True

    def buffers(self):
        return torch.zeros(self.count, dtype=self.dtype), torch.zeros(self.count // self.ranks, dtype=self.dtype)

    def call(self, buffers, group):
        dist.reduce_scatter_tensor(buffers[1], buffers[0], group=group)

    def check(self, group):
        part = self.count // self.ranks
        out = torch.zeros(part, dtype=self.dtype)
        dist.reduce_scatter_tensor(out, _pattern(self.rank, self.count, self.dtype, modulus=8), group=group)
        want = torch.zeros(part, dtype=self.dtype)
        for source in range(self.ranks):
            want += _pattern(source, part, self.dtype, offset=self.rank * part, modulus=8)
        return _count_wrong(out, want)


class Broadcast(Case):
    op, inplace, root = "broadcast", True, 0

    def buffers(self):
        return (torch.zeros(self.count, dtype=self.dtype),)

    def call(self, buffers, group):
        dist.broadcast(buffers[0], src=0, group=group)

    def check(self, group):
        want = _pattern(5, self.count, self.dtype)
        data = want.clone() if self.rank == 0 else torch.zeros(self.count, dtype=self.dtype)
        dist.broadcast(data, src=0, group=group)
        return _count_wrong(data, want)

    def busbw_factor(self):
        return 1.0


class AllToAll(Case):
    op, divisible = "all_to_all_single", True

    def buffers(self):
        return torch.zeros(self.count, dtype=self.dtype), torch.zeros(self.count, dtype=self.dtype)

    def call(self, buffers, group):
        dist.all_to_all_single(buffers[1], buffers[0], group=group)

    def _block(self, source: int, destination: int, part: int) -> torch.Tensor:
        return _pattern(source * 7 + destination * 3, part, self.dtype, modulus=13)

    def check(self, group):
        part = self.count // self.ranks
        data = torch.cat([self._block(self.rank, peer, part) for peer in range(self.ranks)])
        out = torch.zeros(self.count, dtype=self.dtype)
        dist.all_to_all_single(out, data, group=group)
        want = torch.cat([self._block(peer, self.rank, part) for peer in range(self.ranks)])
        return _count_wrong(out, want)


class Barrier(Case):
    """No data: one row with bytes 0; bandwidths are reported as 0."""

    op = "barrier"

    def __init__(self, size, dtype, ranks, rank, sets):
        self.count, self.bytes, self.dtype, self.ranks, self.rank = 0, 0, dtype, ranks, rank
        self.sets = [()]

    def call(self, buffers, group):
        dist.barrier(group=group)

    def check(self, group):
        dist.barrier(group=group)
        return 0

    def busbw_factor(self):
        return 0.0


CASES = {case.op: case for case in (AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, Barrier)}
