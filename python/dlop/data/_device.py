"""Batches moved to an accelerator on a side stream, overlapping the consumer's device work.

Any accelerator torch has a device module for (``torch.cuda``, ``torch.xpu``,
a PrivateUse1 device such as the test accelerator ``torch.dlop_test``): the
module's Stream, Event, stream() and current_stream() are all this uses.

A batch an OffloadLoader lends (``Lent``) views a slot of its pool, which
lies in the device's own pinned memory (the pool is allocated through the
allocator torch's pin_memory() uses for the device): it is uploaded from the
slot itself, with no copy, and the slot goes back to the pool once the
upload's event has passed, found at a later step without waiting. Other
batches (the local fallback's, a plain iterator's) are first copied into
pinned memory, held until their upload has read it. Batch k is handed out as
soon as it has come and its upload is issued, never later: its upload runs
on the device beside the work the consumer queued for batch k-1, and no
batch waits for the one after it. The host waits for an upload only when
more than ``LENT_WHILE_ASKING`` slots are still being read as the next batch
is asked for (the device's link is then what limits the loop): the pool
keeps that many besides its lease window, and a loader short of slots would
wait for ever. The consumer's current
stream waits on each batch's event, and every tensor is marked as used on
that stream for the device's caching allocator.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterator, NamedTuple

import torch

# Lent slots uploads may still read when the loader is asked for its next
# batch: the two slots the LeaseManager's pool keeps besides its lease window.
LENT_WHILE_ASKING = 2


class Lent(NamedTuple):
    """A batch whose tensors view a buffer its loader lends; ``release()`` gives the buffer back,
    and is called once nothing reads it any more."""

    batch: Any
    release: Callable[[], None]


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
    # Uploads not known to have passed, oldest first (one stream runs them in
    # order): (event, what they read, the release of a lent slot or None).
    uploading: collections.deque = collections.deque()

    def settle(lent_at_most: int | None) -> None:
        """Ends the uploads that passed; waits for the oldest while more than `lent_at_most` lent
        slots are still read (None: until every upload has passed)."""
        while uploading:
            event, _, release = uploading[0]
            if not event.query():
                if lent_at_most is not None and sum(r is not None for _, _, r in uploading) <= lent_at_most:
                    return
                event.synchronize()
            uploading.popleft()
            if release is not None:
                release()

    def start(item):
        batch, release = (item.batch, item.release) if isinstance(item, Lent) else (item, None)
        # An upload from pageable memory would make the host wait: such
        # tensors are copied into the device's pinned memory first (a memcpy).
        pinned = _map(batch, lambda t: t if t.is_pinned() else torch.empty(
            t.shape, dtype=t.dtype, pin_memory=True).copy_(t))
        with module.stream(side):
            on_device = _map(pinned, lambda t: t.to(device, non_blocking=True))
            done = module.Event()
            done.record(side)
        uploading.append((done, pinned, release))
        return on_device, done

    try:
        for item in batches:
            on_device, done = start(item)
            consumer = module.current_stream(device)
            consumer.wait_event(done)
            _map(on_device, lambda t: t.record_stream(consumer))
            yield on_device
            settle(LENT_WHILE_ASKING)  # before the loader is asked for its next slot
    finally:
        settle(None)  # what the uploads read may be freed or reused only once read
        close = getattr(batches, "close", None)
        if close is not None:
            close()
