"""Backend "dlop_recording" for the delegation tests: Gloo inside dlop.testing's RecordingBackend.

Imported by each rank before its group is made; DLOP_DEVICE_BACKEND=dlop_recording
then makes it the delegate, for CPU tensors (and dlop_test ones, which the tests
only bind a group to, never send).
"""

import torch.distributed as dist

import dlop.testing.accelerator  # noqa: F401  (loads dlop.testing._accelerator, names dlop_test)
from dlop.testing._accelerator import RecordingBackend

NAME = "dlop_recording"


def _create(store, rank, size, timeout):
    return RecordingBackend(dist.ProcessGroupGloo(store, rank, size, timeout))


if NAME.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(NAME, _create, devices=["cpu", "dlop_test"])
