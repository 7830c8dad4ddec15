"""``dlop_test``: a test accelerator (torch's PrivateUse1 device) on host memory.

``import dlop.testing.accelerator`` loads the extension ``dlop.testing._accelerator``,
names PrivateUse1 ``dlop_test`` and registers this module as ``torch.dlop_test``.
From then on ``torch.device("dlop_test:1")``, ``torch.Stream``, ``torch.Event``,
``torch.accelerator``, ``pin_memory()`` and DDP's device queries work as on a GPU.

Each stream runs its operators, copies and event waits on a worker thread of
its own, in order, after the call that queued them returns: the host runs
ahead of the device, as on a GPU. Operators take a modelled time on the
device's compute engine, and copies on its copy engines (one per direction).
Copies can be made late on purpose, so that a missing event wait shows as
wrong data instead of passing by luck (docs/test_accelerator.md explains the
model).

Environment, read when the extension loads (a bad value fails the import):

``DLOP_TEST_DEVICE_COUNT``
    number of devices (default 2).
``DLOP_TEST_DEVICE_DELAY_US``
    every queued copy takes at least this long (default 0): it reads its source
    halfway through and writes its destination at the end.
``DLOP_TEST_DEVICE_COPY_GBPS``
    bandwidth of the host link in GB/s (default 0: unlimited); a copy of n
    bytes to or from the host takes at least n / rate, e.g. 25 for a PCIe link.
``DLOP_TEST_DEVICE_MEM_GBPS``
    device memory bandwidth in GB/s; a copy within a device reads and writes
    its n bytes, 2n / rate (default: 90 times the link's, a GPU's proportion,
    so free with an unlimited link; 0: free).
``DLOP_TEST_DEVICE_OP_US``
    every queued operator takes at least this long on the device (default 0).
``DLOP_TEST_DEVICE_TFLOPS``
    the device's rate for matrix products and convolutions (default 0: free).
``DLOP_TEST_DEVICE_QUERY_US``
    what an event query costs the host (default 0).
``DLOP_TEST_DEVICE_SHARE``
    which processes share each device index's engines, so that their work
    time-slices one device, as a GPU's does: by default the processes started
    by one parent (the ranks of one launcher); a name shares across parents;
    ``0`` gives each process devices of its own.

:func:`configure` (or the context manager :func:`timing`) changes all but the
count and the share for the work queued afterwards.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch

from dlop.testing import _accelerator as _C

NAME = "dlop_test"

__all__ = [
    "NAME",
    "Event",
    "Stream",
    "compute_counts",
    "configure",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_shared",
    "host_waits",
    "init",
    "is_available",
    "is_initialized",
    "manual_seed",
    "open_shared",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_device",
    "set_stream",
    "settings",
    "share_key",
    "stream",
    "stream_priority",
    "synchronize",
    "timing",
]


def _index(device: torch.device | str | int | None) -> int:
    """The device index meant by ``device`` (None: the current device)."""
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != NAME:
        raise ValueError(f"expected a {NAME} device, got {device}")
    return _C.current_device() if device.index is None else device.index


# --- devices ---


def is_available() -> bool:
    return _C.device_count() > 0


def is_initialized() -> bool:
    return True


def init() -> None:
    """Nothing to do: the devices are ready once this module is imported."""


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device: torch.device | str | int) -> None:
    _C.set_device(_index(device))


class device:
    """Context manager that makes ``device`` the current device of this thread."""

    def __init__(self, device: torch.device | str | int | None):
        self._index = None if device is None else _index(device)
        self._previous = -1

    def __enter__(self):
        self._previous = _C.current_device()
        if self._index is not None:
            _C.set_device(self._index)
        return self

    def __exit__(self, *exc):
        _C.set_device(self._previous)
        return False


def synchronize(device: torch.device | str | int | None = None) -> None:
    """Waits until every stream of the device has run what was queued on it."""
    _C.synchronize(_index(device))


# --- streams and events: torch.Stream and torch.Event on this device ---


class Stream(torch.Stream):
    """A new stream of a dlop_test device (default: the current device).

    ``Stream(stream_id=..., device_index=..., device_type=...)`` names an
    existing stream instead. It is a ``torch.Stream``: ``wait_event``,
    ``wait_stream``, ``record_event``, ``query``, ``synchronize``, and ``with``
    makes it the current stream.
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device(NAME, _index(device)), priority=priority)


class Event(torch.Event):
    """An event of a dlop_test device (default: the current device); a ``torch.Event``."""

    def __new__(cls, device=None, **kwargs):
        return super().__new__(cls, device=torch.device(NAME, _index(device)), **kwargs)


def _as_stream(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device: torch.device | str | int | None = None) -> Stream:
    """The calling thread's current stream of the device (the default stream until set)."""
    return _as_stream(torch.accelerator.current_stream(_index(device)))


def default_stream(device: torch.device | str | int | None = None) -> Stream:
    stream_id, device_index, device_type = _C.default_stream(_index(device))
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` the calling thread's current stream of its device."""
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(s: torch.Stream | None) -> Iterator[None]:
    """Within the block, ``s`` is the current stream (and its device the current device)."""
    if s is None:
        yield
        return
    with s:
        yield


# --- random numbers: operators run on the CPU, with torch's CPU generator ---


def manual_seed(seed: int) -> None:
    """Nothing to seed: random operators on dlop_test use the CPU generator, which torch.manual_seed seeds."""


def manual_seed_all(seed: int) -> None:
    """See :func:`manual_seed`."""


def seed() -> None:
    """See :func:`manual_seed`."""


def seed_all() -> None:
    """See :func:`manual_seed`."""


def _is_in_bad_fork() -> bool:
    """torch.manual_seed asks; a forked child may use the devices only if the parent has not."""
    return False


# --- timing of the work ---

_SETTINGS = ("delay_us", "copy_gbps", "mem_gbps", "op_us", "tflops", "query_us")


def configure(**settings: float | None) -> dict:
    """Changes the timing of the work queued from now on: ``delay_us`` and
    ``copy_gbps`` of copies, ``mem_gbps`` of copies within a device (-1: 90
    times ``copy_gbps``), ``op_us`` and ``tflops`` of operators,
    ``query_us`` of event queries; None leaves a setting as it is. Returns all
    the previous settings, which ``configure(**previous)`` restores."""
    unknown = set(settings) - set(_SETTINGS)
    if unknown:
        raise TypeError(f"configure: unknown setting(s) {sorted(unknown)}; expected some of {_SETTINGS}")
    return _C.configure(**{k: v for k, v in settings.items() if v is not None})


def settings() -> dict:
    """The timing in force: ``delay_us``, ``copy_gbps``, ``mem_gbps``, ``op_us``, ``tflops``, ``query_us``."""
    return _C.timing()


def share_key() -> str:
    """The key of the processes this one shares its devices' engines with ('' when they are its own)."""
    return _C.share_key()


@contextlib.contextmanager
def timing(**settings: float | None) -> Iterator[None]:
    """:func:`configure` for the duration of a block."""
    previous = configure(**settings)
    try:
        yield
    finally:
        configure(**previous)


def compute_counts() -> tuple[int, int]:
    """Operators this process queued on streams, and operators that ran at once on the host."""
    return _C.compute_counts()


def host_waits() -> int:
    """How many times the calling thread has blocked until a stream ran its work
    (synchronize, a blocking copy, an operator that must run at once)."""
    return _C.host_waits()


def stream_priority(s: torch.Stream) -> int:
    """0, or -1 for a stream of high priority (recorded, not scheduled by)."""
    return _C.stream_priority(s.stream_id, s.device_index)


# --- device memory shared between processes, as CUDA's IPC handles share a GPU's ---


def empty_shared(nbytes: int, device: torch.device | str | int | None = None) -> tuple[torch.Tensor, str]:
    """``nbytes`` of device memory (a uint8 tensor) that other processes can open, and its handle.

    The memory lives while this tensor, or a tensor any process opened from the
    handle, does; the handle opens only while this process keeps the tensor.
    """
    return _C.shared_device_memory(nbytes, _index(device))


def open_shared(handle: str, nbytes: int, device: torch.device | str | int | None = None) -> torch.Tensor:
    """Another process's :func:`empty_shared` memory, mapped here as a uint8 tensor on ``device``."""
    return _C.open_shared_device_memory(handle, nbytes, _index(device))


def event_queries() -> int:
    """How many times this process has queried events (what a GPU's driver would be asked)."""
    return _C.event_queries()


def _register() -> None:
    """Names PrivateUse1 and registers this module as ``torch.dlop_test``; a second call does nothing."""
    name = torch._C._get_privateuse1_backend_name()
    if name != NAME:
        if name != "privateuseone":
            raise RuntimeError(f"PrivateUse1 is already the device {name!r}: {NAME} cannot be registered")
        torch.utils.rename_privateuse1_backend(NAME)
    if getattr(torch, NAME, None) is None:
        torch._register_device_module(NAME, sys.modules[__name__])
    if not hasattr(torch.Tensor, "is_" + NAME):
        torch.utils.generate_methods_for_privateuse1_backend()
    import dlop  # backend "dlop" serves the device, in groups made before this import too

    dlop.register_device(NAME)
    # Operators are queued once their meta kernels have shaped the outputs;
    # torch's first meta call loads for about a second, which would make the
    # first operator on the device late on purpose.
    meta = torch.empty(1, 1, device="meta")
    (meta * 1 + 1) @ meta


_register()
