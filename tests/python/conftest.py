"""Hooks for every file in tests/python."""

from __future__ import annotations


def pytest_collection_modifyitems(session, config, items):
    """Files marked long_file go first, in their order; the rest keep theirs.

    Under xdist's --dist loadfile (make test-python) a worker takes a whole file at a time, in this
    order: a file of several minutes handed out last would run on one worker while the other idles.
    """
    items.sort(key=lambda item: item.get_closest_marker("long_file") is None)
