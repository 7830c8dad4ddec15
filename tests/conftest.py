"""Hooks for every file in tests/python (the product's tests) and tests/bench (the benchmark lab's)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_SHARE = "DLOP_TEST_DEVICE_SHARE"


def pytest_configure(config):
    # A GPU is time-sliced by every process that uses it; dlop_test shares a device's engines among the
    # processes of one key. Each test process (pytest, or each xdist worker) and the ranks it starts get
    # a key of their own, so that two workers' tests never time-slice each other's devices.
    if os.environ.get(_SHARE, "pytest-").startswith("pytest-"):
        os.environ[_SHARE] = f"pytest-{os.getpid()}"
    # xdist's --dist loadfile otherwise hands files out by how many tests they hold, most first
    # (--loadscope-reorder, its default), whatever order the items below are in.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_unconfigure(config):
    if os.environ.get(_SHARE) == f"pytest-{os.getpid()}":
        for lock in (Path(tempfile.gettempdir()) / "dlop_test-engines").glob(f"name-pytest-{os.getpid()}-*.lock"):
            lock.unlink(missing_ok=True)


def _seconds(item) -> float:
    marker = item.get_closest_marker("long_file")
    return marker.kwargs.get("seconds", 60) if marker else 0


def pytest_collection_modifyitems(session, config, items):
    """Files marked long_file go first, the longest first; the rest keep their order.

    Under xdist's --dist loadfile (make test-python) a worker takes a whole file at a time, in this
    order: a file of several minutes handed out last would run on one worker while the other idles.
    """
    items.sort(key=lambda item: -_seconds(item))
