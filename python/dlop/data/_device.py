"""Batches moved to an accelerator on a side stream, overlapping the consumer's device work.

Any accelerator torch has a device module for (``torch.cuda``, ``torch.xpu``,
a PrivateUse1 device such as the test accelerator ``torch.dlop_test``): the
module's Stream, Event, stream() and current_stream() are all this uses.

Each batch is copied from the loader's pool slot into the device's pinned
memory (the pool is page-locked, but not known to the device), so the slot
is not read after the batch is handed out, and uploaded from there on the
side stream. Batch k is handed out as soon as it has come and its upload is
issued, never later: its upload runs on the device beside the work the
consumer queued for batch k-1, and no batch waits for the one after it. The
host never waits for an upload: the consumer's current stream waits on each
batch's event, and every tensor is marked as used on that stream for the
device's caching allocator.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch


def accelerator_device(device: Any) -> torch.device | None:
    """The accelerator to deliver to, None for the CPU; ValueError when it cannot be used."""
    if device is None:
        return None
    d = torch.device(device)
    if d.type == "cpu":
        return None
    module = getattr(torch, d.type, None)
    if module is None or not hasattr(module, "Stream") or not module.is_available():
        raise ValueError(f"OffloadLoader: device {d} asked for, but this torch has no usable {d.type} device")
    return torch.device(d.type, module.current_device() if d.index is None else d.index)


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
    module = getattr(torch, device.type)
    side = module.Stream(device)
    uploading: list[tuple[Any, Any]] = []  # (event, pinned copy): kept until the upload has read it

    def start(cpu):
        # The pool's buffers are page-locked, but the device does not know
        # them: an upload from them would make the host wait. A copy into
        # the device's own pinned memory (a memcpy) lets the upload go async,
        # and leaves the pool's slot free for its next batch.
        pinned = _map(cpu, lambda t: t if t.is_pinned() else torch.empty(
            t.shape, dtype=t.dtype, pin_memory=True).copy_(t))
        with module.stream(side):
            on_device = _map(pinned, lambda t: t.to(device, non_blocking=True))
            done = module.Event()
            done.record(side)
        uploading[:] = [u for u in uploading if not u[0].query()] + [(done, pinned)]
        return on_device, done

    try:
        for cpu in batches:
            on_device, done = start(cpu)
            consumer = module.current_stream(device)
            consumer.wait_event(done)
            _map(on_device, lambda t: t.record_stream(consumer))
            yield on_device
    finally:
        for event, _ in uploading:  # the pinned copies may be freed only once read
            event.synchronize()
