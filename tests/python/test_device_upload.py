"""Batches for an accelerator: dlop.data._device.to_device hands each batch out as soon as it has
come, and `dlop run` pins its copies for whatever accelerator torch has (here the test one)."""

import pytest
import torch

import dlop.testing.accelerator as accelerator
from dlop.data import run_loaders
from dlop.data import _device


def test_a_batch_is_handed_out_without_waiting_for_the_next():
    """The first batch comes out when the loader has made one, not two; the last when it has made
    them all; each with its values, read on the current stream after a slow (20 ms) copy."""
    device = torch.device(accelerator.NAME, 0)
    made = []

    def loader():
        for k in range(3):
            made.append(k)
            yield torch.full((4,), k, dtype=torch.int32), {"k": torch.tensor([k])}

    previous = accelerator.configure(delay_us=20_000)
    try:
        batches = _device.to_device(loader(), device)
        got = []
        for x, extra in batches:
            assert len(made) == len(got) + 1  # this batch, and not the next one, was taken from the loader
            assert x.device == device and extra["k"].device == device
            got.append((x.cpu().tolist(), extra["k"].item()))
    finally:
        accelerator.configure(**previous)
    assert got == [([k] * 4, k) for k in range(3)]


def test_a_consumer_that_stops_early_leaves_no_upload_behind():
    device = torch.device(accelerator.NAME, 1)
    previous = accelerator.configure(delay_us=20_000)
    try:
        batches = _device.to_device(iter([torch.arange(8), torch.arange(8)]), device)
        first = next(batches)
        batches.close()  # waits for the uploads that read pinned copies
        assert first.cpu().tolist() == list(range(8))
    finally:
        accelerator.configure(**previous)


def test_dlop_run_pins_for_the_current_accelerator(monkeypatch):
    assert run_loaders._accelerator_to_pin_for().type == accelerator.NAME
    batch = run_loaders._own([torch.ones(3), {"y": torch.zeros(2)}], pin=True)
    assert batch[0].is_pinned() and batch[1]["y"].is_pinned()
    assert not run_loaders._own(torch.ones(3), pin=False).is_pinned()

    # No accelerator, or one that is not usable now, or MPS (torch does not pin there): no pinning.
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: None)
    assert run_loaders._accelerator_to_pin_for() is None
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("mps"))
    assert run_loaders._accelerator_to_pin_for() is None
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device(accelerator.NAME))
    monkeypatch.setattr(torch.dlop_test, "is_available", lambda: False)
    assert run_loaders._accelerator_to_pin_for() is None


@pytest.mark.parametrize("pin", [True, False])
def test_dlop_run_generate_pins_as_the_loader_asks(pin):
    class Offloader:  # what _Offloaded._generate reads of an OffloadLoader
        kind = "image"  # a native source's batches, (samples, labels)
        offloaded = True

        def __iter__(self):
            yield torch.ones(2, 3), torch.arange(2)

    (x, y), = list(run_loaders._Offloaded(Offloader(), [])._generate(pin))
    assert x.is_pinned() == pin and y.is_pinned() == pin
