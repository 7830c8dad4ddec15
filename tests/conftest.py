"""Hooks for every file in tests/python (the product's tests) and tests/bench (the benchmark lab's)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from _pytest.runner import runtestprotocol

_SHARE = "DLOP_TEST_DEVICE_SHARE"
_RETRIED = "retried once"


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


def _alone_reason(item) -> str | None:
    marker = item.get_closest_marker("alone")
    if marker is None:
        return None
    return marker.kwargs.get("reason") or (marker.args[0] if marker.args else "it measures time")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked alone whose call fails runs once more, and the log says so.

    It measures time or counts machine-wide state, so another process's burst can fail it: one
    retry, never silent. A failed set-up is not retried (no measurement ran)."""
    reason = _alone_reason(item)
    if reason is None:
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    failed = [r for r in reports if r.when == "call" and r.failed]
    if failed:
        crash = getattr(failed[0].longrepr, "reprcrash", None)
        first = (crash.message if crash else failed[0].longreprtext).strip().splitlines()[0]
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        for r in reports:
            r.user_properties.append((_RETRIED, f"{reason}; the first run failed: {first}"))
    for r in reports:
        item.ihook.pytest_runtest_logreport(report=r)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


_retries: list[str] = []


def pytest_runtest_logreport(report):
    # Runs where the log is written (the controller, under xdist): the retries are listed at the end.
    if report.when == "call":
        for name, said in report.user_properties:
            if name == _RETRIED:
                _retries.append(f"{_RETRIED}: {report.nodeid} ({report.outcome}): {said}")


def pytest_terminal_summary(terminalreporter):
    if _retries:
        terminalreporter.write_sep("=", f"{len(_retries)} alone test(s) {_RETRIED}")
        for line in _retries:
            terminalreporter.write_line(line)
