"""A staged call on a device given without an index (-1) uses the current device's streams.

The copy-out stream is looked up after the index is resolved: looked up by -1, the
streams of whichever device was current at the first such call would serve every
later one, whose copies would then be ordered on another device's stream.
"""

from __future__ import annotations

import pytest
import torch

acc = pytest.importorskip("dlop.testing.accelerator", reason="dlop.testing._accelerator is not built")
from dlop import _C  # noqa: E402


def test_a_device_without_an_index_uses_the_current_devices_streams():
    previous = acc.current_device()
    try:
        for index in (1, 0, 1):
            acc.set_device(index)
            stream_id, device_index = _C._device_call_stream(torch.device("dlop_test"))
            assert device_index == index
            assert (stream_id, device_index) == _C._device_call_stream(torch.device("dlop_test", index))
    finally:
        acc.set_device(previous)
