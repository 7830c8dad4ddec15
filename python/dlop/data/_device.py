"""Batches moved to a GPU on a side stream, one batch ahead of the consumer.

The loader's CPU batches view pool slots that are reused once the next batch
is asked for, so a slot may be given back only after its copy has finished:
the copy of batch k is waited for (its event) before batch k+1 is pulled, and
batch k+1's copy is issued before batch k is handed out, so it overlaps the
consumer's work on batch k. The consumer's stream waits on each batch's
event, and every tensor is marked as used on that stream for the caching
allocator.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch


def cuda_device(device: Any) -> torch.device | None:
    """The CUDA device to deliver to, None for the CPU; ValueError when it cannot be used."""
    if device is None:
        return None
    d = torch.device(device)
    if d.type == "cpu":
        return None
    if d.type != "cuda":
        raise ValueError(f"OffloadLoader: device {d} is neither the CPU nor a CUDA device")
    if not torch.cuda.is_available():
        raise ValueError(f"OffloadLoader: device {d} asked for, but this torch sees no CUDA device")
    return torch.device("cuda", torch.cuda.current_device() if d.index is None else d.index)


def _map(batch: Any, fn) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return type(batch)((k, _map(v, fn)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_map(v, fn) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map(v, fn) for v in batch)
    return batch


def to_device(batches: Iterator[Any], device: torch.device) -> Iterator[Any]:
    side = torch.cuda.Stream(device)

    def start(cpu):
        with torch.cuda.stream(side):
            gpu = _map(cpu, lambda t: t.to(device, non_blocking=True))
            done = torch.cuda.Event()
            done.record(side)
        return gpu, done

    cpu = next(batches, None)
    if cpu is None:
        return
    gpu, done = start(cpu)
    while True:
        done.synchronize()  # the slot behind `cpu` is read: it may go back to the pool
        following = next(batches, None)
        consumer = torch.cuda.current_stream(device)
        consumer.wait_event(done)
        _map(gpu, lambda t: t.record_stream(consumer))
        ahead = start(following) if following is not None else None
        yield gpu
        if ahead is None:
            return
        gpu, done = ahead
