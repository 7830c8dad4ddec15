"""bench.autoscale's dataset: samples whose cost follows a schedule of phases.

A module of its own so that the offloaders' Python workers import it by name
(a class of the benchmark's ``__main__`` would travel by value and drag the
benchmark's imports along).

The loader runs with ``shuffle=False`` over exactly one epoch, so sample i is
in step i // batch: its phase, and so its cost, is a pure function of its
index. The change of cost therefore lands exactly at the phase's first step,
whatever the loader has leased ahead, and every fleet sees the same work.
"""

from __future__ import annotations

import bisect
import time


class PhasedSamples:
    """``phases``: (steps, milliseconds per sample) in order; sample i sleeps its phase's cost and returns
    (a small tensor of i, i). The cost is a sleep: a sample that waits on something (a remote read, a
    decode service) rather than on this machine's 2 cores, so that each offloader adds the same capacity
    however many share the cores."""

    def __init__(self, batch: int, phases: list[tuple[int, float]]) -> None:
        if batch < 1 or not phases or any(steps < 1 or ms < 0 for steps, ms in phases):
            raise ValueError(f"PhasedSamples: batch {batch} and phases {phases} need a batch and steps of 1 or more "
                             "and costs of 0 ms or more")
        self.batch = int(batch)
        self.ends, self.costs, end = [], [], 0
        for steps, ms in phases:
            end += int(steps)
            self.ends.append(end)
            self.costs.append(float(ms) / 1000.0)

    def __len__(self) -> int:
        return self.ends[-1] * self.batch

    def cost(self, index: int) -> float:
        return self.costs[bisect.bisect_right(self.ends, index // self.batch)]

    def __getitem__(self, index: int):
        import torch

        if not 0 <= index < len(self):
            raise IndexError(index)
        time.sleep(self.cost(index))
        return torch.full((8,), float(index)), index
