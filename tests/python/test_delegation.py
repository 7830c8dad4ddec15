"""Delegation passes the Backend API on: DLOP_DEVICE_BACKEND names a backend that records its calls.

The delegate is Gloo inside a recording backend (recording_delegate.py), so each
call dlop passes on is seen by name and argument, including those Gloo ignores
or refuses, and the collectives still run on Gloo and are checked exactly.
"""

from __future__ import annotations

import datetime
import importlib.util
import time

import pytest
from c10d_harness import Setup, run_ranks

needs_recording = pytest.mark.skipif(importlib.util.find_spec("dlop.testing._accelerator") is None,
                                     reason="RecordingBackend is in the test accelerator (torch 2.8 or newer)")

SETUP = Setup(gloo=False, imports=("recording_delegate",), env={"DLOP_DEVICE_BACKEND": "dlop_recording"})


def _settled(pg) -> int:
    """Gradients the engine still counts, once delegated CPU works' callbacks ran."""
    deadline = time.monotonic() + 5
    while pg.gradients_in_flight and time.monotonic() < deadline:
        time.sleep(0.001)
    return pg.gradients_in_flight


def rank_passes_calls_on(ctx) -> dict:
    import torch
    import torch.distributed as dist

    world = dist.group.WORLD
    pg = world._get_backend(torch.device("cpu"))
    rec = pg.device_backend
    size, rank = ctx.world_size, ctx.rank
    total = float(size * (size + 1) // 2)
    out: dict = {"delegate": type(rec).__name__}

    world.set_timeout(datetime.timedelta(seconds=77))

    # _coalescing_manager: start, the group's all-reduces as one call, end.
    a, b = torch.full((5,), float(rank + 1)), torch.arange(3.0) * (rank + 1)
    with dist._coalescing_manager(device=torch.device("cpu")):
        dist.all_reduce(a)
        dist.all_reduce(b)
    out["coalesced"] = torch.equal(a, torch.full((5,), total)) and torch.equal(
        b, torch.arange(3.0) * total)
    out["after_coalesced"] = _settled(pg)

    # batch_isend_irecv coalesces, as the delegate supports it: one Work for the ring.
    send, got = torch.full((4,), float(rank)), torch.zeros(4)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (rank + 1) % size),
                                    dist.P2POp(dist.irecv, got, (rank - 1) % size)])
    for work in works:
        work.wait()
    out["ring"] = (len(works), torch.equal(got, torch.full((4,), float((rank - 1) % size))))

    world._register_on_completion_hook(lambda info: None)
    try:
        pg.mem_allocator  # noqa: B018  (torch's Python wraps only its own allocators: the record is the check)
    except TypeError:
        pass
    out["calls"] = list(rec.calls)

    # A group bound to a device connects its delegate at once, bound to it too.
    bound = dist.new_group(backend="dlop", device_id=torch.device("dlop_test", 0))
    bound_pg = bound._get_backend(torch.device("cpu"))
    bound_rec = bound_pg.device_backend
    out["bound_calls"] = list(bound_rec.calls)
    bound_pg.shutdown()
    out["after_shutdown"] = (bound_pg.device_backend is None, list(bound_rec.calls))

    aborted = dist.new_group(backend="dlop")
    aborted_pg = aborted._get_backend(torch.device("cpu"))
    aborted_rec = aborted_pg.device_backend
    aborted_pg.abort()
    out["after_abort"] = (aborted_pg.device_backend is None, list(aborted_rec.calls))
    return out


@needs_recording
def test_delegation_passes_each_backend_call_on_to_the_delegate():
    for rank, r in enumerate(run_ranks(rank_passes_calls_on, 2, setup=SETUP, timeout=120)):
        assert r["delegate"] == "RecordingBackend", (rank, r)
        assert r["coalesced"], f"rank {rank}: coalesced all-reduces gave wrong results"
        assert r["after_coalesced"] == 0, f"rank {rank}: the coalesced group is still counted"
        assert r["ring"] == (1, True), f"rank {rank}: batch_isend_irecv gave {r['ring']}"
        assert r["calls"] == [
            "setTimeout 77000",
            "startCoalescing", "endCoalescing 1",  # the all-reduces, as one allreduce_coalesced
            "startCoalescing", "endCoalescing 2",  # the send and the receive
            "registerOnCompletionHook",
            "getMemAllocator",
        ], (rank, r["calls"])
        assert r["bound_calls"] == ["eagerConnectSingleDevice dlop_test:0 bound dlop_test:0"], (rank, r)
        assert r["after_shutdown"] == (True, r["bound_calls"] + ["shutdown"]), (rank, r)
        assert r["after_abort"] == (True, ["abort"]), (rank, r)


def rank_coalesces_its_own_calls(ctx) -> dict:
    import torch
    import torch.distributed as dist

    rank, size = ctx.rank, ctx.world_size
    a = torch.full((7,), float(rank + 1))
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.all_reduce(a)
    cm.wait()
    return {"exact": torch.equal(a, torch.full((7,), float(size * (size + 1) // 2))), "works": len(cm.works)}


def test_dlop_coalesces_the_calls_it_runs_itself():
    setup = Setup(gloo=False, env={"DLOP_DEVICE_BACKEND": "staged"})
    for rank, r in enumerate(run_ranks(rank_coalesces_its_own_calls, 2, setup=setup, timeout=120)):
        assert r == {"exact": True, "works": 1}, (rank, r)


class _Store:
    """The two calls of a c10d store that the device check makes, over a dict shared by the "ranks"."""

    def __init__(self, keys: dict):
        self.keys = keys

    def set(self, key, value):
        self.keys[key] = value.encode()

    def get(self, key):
        return self.keys[key]


@pytest.mark.parametrize(("devices", "own"), [
    (["h1 GPU-a", "h1 GPU-b"], True),    # each shown its GPU as cuda:0 (CUDA_VISIBLE_DEVICES): apart
    (["h1 GPU-a", "h1 GPU-a"], False),   # both on the GPU they were left on
    (["h1 GPU-a", "h2 GPU-a", "h1 GPU-b"], True),
    (["h1 cuda:0", "h2 cuda:0"], True),  # no UUID: the index on each host
    (["h1 cuda:1", "h1 cuda:1", "h2 cuda:0"], False),
], ids=["visible-devices", "same-gpu", "hosts", "no-uuid", "shared-index"])
def test_auto_compares_the_devices_ranks_use_not_their_counts(monkeypatch, devices, own):
    from dlop.c10d import device as device_backend

    keys = {f"dlop-devices/{rank}": device.encode() for rank, device in enumerate(devices)}  # all ranks have set
    answers = set()
    for rank, device in enumerate(devices):
        monkeypatch.setattr(device_backend, "_device_in_use", lambda _type, d=device: d)
        answers.add(device_backend._each_rank_has_own_device(_Store(keys), rank, len(devices), "cuda"))
    assert answers == {own}
