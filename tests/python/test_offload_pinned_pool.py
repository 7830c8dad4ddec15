"""An OffloadLoader with a device keeps its pool in that device's pinned memory: batches are uploaded
from their slots with no copy, and a slot goes back to the pool only once its upload has read it,
found without the host waiting. Without a device the pool stays plain page-locked memory. On the
test accelerator `dlop_test`, whose copies run late and whose pinned allocation waits for every
device, as cudaHostAlloc does."""

from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np
import pytest

from processes import Daemon, token_file_with

torch = pytest.importorskip("torch")
offload = pytest.importorskip("dlop._C").offload
media = pytest.importorskip("dlop._C").media
accelerator = pytest.importorskip("dlop.testing.accelerator")

from dlop.data import OffloadLoader, _device  # noqa: E402

TOKEN = "offload-pinned-pool-test-token-0123456789"
SPEC = {"ops": [{"op": "random_resized_crop", "size": 32}, {"op": "hflip", "p": 0.5}], "output": "uint8"}
SEED, BATCH = 5, 4
DEVICE = torch.device(accelerator.NAME, 1)


def reference(dataset: str, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    source = media.open_source(dataset)
    pipeline = media.ImagePipeline(json.dumps(SPEC))
    plan = offload.EpochPlan(len(source), BATCH, SEED, True, False, 0, 1)
    return [pipeline.run_batch(source, indices, seed=SEED, epoch=epoch)[:2] for indices in plan.batches(epoch)]


def manager(dataset, daemons, **kw):
    m = offload.LeaseManager(dataset, json.dumps(SPEC), SEED, BATCH, TOKEN, prefetch=2, **kw)
    for d in daemons:
        host, port = d.address.rsplit(":", 1)
        m.add_daemon(host, int(port))
    return m


@pytest.mark.parametrize("pin_for", [str(DEVICE), None])
def test_the_pool_is_pinned_for_the_device_it_uploads_to(dataset, daemons, pin_for):
    """pin_for a device: every batch tensor is pinned as torch sees it for that device; None (a loader
    without a device): the old page-locked pool, not the device's, and its batches are right too."""
    m = manager(dataset, daemons, pin_for=pin_for)
    m.restore({**m.state(), "epoch": 0, "position": 0})
    want = reference(dataset, 0)
    k = 0
    while (got := m.next()) is not None:
        position, samples, labels, slot, _, _ = got
        assert samples.is_pinned() == (pin_for is not None) and labels.is_pinned() == (pin_for is not None)
        assert samples.numpy().tobytes() == want[position][0].tobytes()
        assert np.array_equal(labels.numpy(), want[position][1])
        m.release(slot)
        k += 1
    assert k == len(want)


def test_a_device_without_pinned_memory_is_refused_when_the_loader_is_made(dataset, daemons):
    with pytest.raises(ValueError, match="no pinned host memory for device meta"):
        manager(dataset, daemons, pin_for="meta")


class PinnedCounter:
    """Counts torch.empty(..., pin_memory=True): a copy of a batch into other pinned memory."""

    def __init__(self, monkeypatch):
        self.count, real = 0, torch.empty

        def empty(*args, **kw):
            self.count += bool(kw.get("pin_memory"))
            return real(*args, **kw)

        monkeypatch.setattr(torch, "empty", empty)


def test_batches_are_uploaded_from_their_slots_and_the_host_never_waits(dataset, daemons, monkeypatch):
    """A fast consumer on late (20 ms) copies: every batch right although its slot is leased again
    for a later batch, and none copied into other pinned memory. A consumer slower than the copies:
    the host never waits for the device, the slots' release included."""
    pinned = PinnedCounter(monkeypatch)
    previous = accelerator.configure(delay_us=20_000)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader = OffloadLoader(dataset, SPEC, BATCH, seed=SEED, offloaders=[d.address for d in daemons],
                                   token=TOKEN, prefetch=2, device=str(DEVICE))
        for epoch, pause in ((0, 0.0), (1, 0.2)):
            loader.set_epoch(epoch)
            on_device = []
            waits = None
            for x, y in loader:
                assert x.device == DEVICE and y.device == DEVICE
                on_device.append((x, y))
                if waits is None:  # from the first batch on: the pool exists, the daemons are warm
                    waits = accelerator.host_waits()
                time.sleep(pause)
            if pause:
                assert accelerator.host_waits() == waits, "the host waited for the device during the epoch"
            got = [(x.cpu().numpy(), y.cpu().numpy()) for x, y in on_device]
            want = reference(dataset, epoch)
            assert len(got) == len(want)
            for k, ((gx, gy), (wx, wy)) in enumerate(zip(got, want)):
                assert gx.tobytes() == wx.tobytes() and np.array_equal(gy, wy), f"epoch {epoch} batch {k} differs"
        assert pinned.count == 0, "batches were copied into other pinned memory"
    finally:
        accelerator.configure(**previous)


@pytest.mark.parametrize("pause", [0.0, 0.1])
def test_a_lent_slot_is_released_once_its_upload_has_passed_and_not_before(pause):
    """A pool of LENT_WHILE_ASKING + 1 pinned slots, each scribbled over when released, as the daemon
    writing the next batch into it would: every upload must still read its own batch, each slot must
    come back after its batch was handed out, and the pool must never run dry. A consumer slower than
    the copies (`pause`): the host never waits for an upload."""
    device = torch.device(accelerator.NAME, 0)
    free = [torch.empty(1 << 16, dtype=torch.int32, pin_memory=True) for _ in range(_device.LENT_WHILE_ASKING + 1)]
    handed_out, released = [], []

    def loader():
        for k in range(6):
            assert free, f"batch {k}: every slot is still lent"
            slot = free.pop(0)
            slot.fill_(k)

            def release(slot=slot, k=k):
                assert k in handed_out, f"slot of batch {k} released before the batch was handed out"
                released.append(k)
                slot.fill_(-1)
                free.append(slot)

            yield _device.Lent((slot, {"k": slot[:1]}), release)

    previous = accelerator.configure(delay_us=20_000)
    try:
        got, waits = [], None
        for k, (x, extra) in enumerate(_device.to_device(loader(), device)):
            handed_out.append(k)
            got.append((x, extra["k"]))
            waits = accelerator.host_waits() if waits is None else waits
            time.sleep(pause)
        if pause:
            assert accelerator.host_waits() == waits, "the host waited for an upload"
        values = [(int(x.min().item()), int(x.max().item()), int(one.item())) for x, one in got]
    finally:
        accelerator.configure(**previous)
    assert values == [(k, k, k) for k in range(6)]
    assert released == list(range(6))


class Growing(torch.utils.data.Dataset):
    """Samples that grow with the index: each slot grows to a new pinned buffer now and then."""

    def __len__(self) -> int:
        return 19

    def __getitem__(self, i: int):
        return torch.full((i * 700 + 1,), i, dtype=torch.int32)


def keep_list(samples):
    return list(samples)


def test_the_python_path_grows_its_slots_in_the_devices_pinned_memory(tmp_path, monkeypatch):
    """dataset= with a device: batches of growing size land in slots that grow in the device's
    pinned memory, each uploaded from its slot (no other pinned copy) with its own values."""
    token_file = token_file_with(tmp_path / "token", TOKEN)
    daemons = [Daemon(token_file, "--python", sys.executable) for _ in range(2)]
    pinned = PinnedCounter(monkeypatch)
    previous = accelerator.configure(delay_us=20_000)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader = OffloadLoader(dataset=Growing(), collate_fn=keep_list, batch_size=3, shuffle=False,
                                   offloaders=[d.address for d in daemons], token=TOKEN, prefetch=2,
                                   device=str(DEVICE))
        on_device = list(loader)
        got = [[t.cpu().tolist() for t in batch] for batch in on_device]
    finally:
        accelerator.configure(**previous)
        for d in daemons:
            d.kill()
    assert got == [[[i] * (i * 700 + 1) for i in range(k, min(k + 3, 19))] for k in range(0, 19, 3)]
    assert pinned.count == 0, "batches were copied into other pinned memory"
