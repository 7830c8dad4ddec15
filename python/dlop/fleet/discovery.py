"""Offloader discovery through the training job's c10d store.

An offloader announces the address trainers can reach it at; trainers read
the list, and a :class:`Watcher` reports offloaders that join later (also
mid-epoch). Only ``add``, ``set``, ``get`` and ``check`` are used, so any c10d
store works; use the *raw* store (a ``PrefixStore`` would hide the keys from
an offloader that connects to the TCPStore itself: see :func:`raw_store`).

Key layout (all under ``dlop/offloaders/``):

    dlop/offloaders/count   a counter (``store.add``): how many announcements
                            were ever made; announcement i (1-based) owns
    dlop/offloaders/<i>     the address "host:port", or "" once withdrawn.

The counter is taken first (``add`` is atomic, so concurrent announcers get
distinct indices), the entry is set after it: a reader can briefly see a
count whose entry is not there yet; it skips that index and looks again on
the next poll, so join order is kept and nobody blocks on a missing key (an
announcer that died between the two steps leaves a hole, never a hang).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

PREFIX = "dlop/offloaders/"
COUNT = PREFIX + "count"

_log = logging.getLogger("dlop.fleet.discovery")


def _entry(index: int) -> str:
    return f"{PREFIX}{index}"


def announce(store: Any, address: str) -> int:
    """Publishes `address` ("host:port"); returns its index (for :func:`withdraw`)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"dlop.fleet.discovery.announce: address {address!r} is not host:port")
    index = int(store.add(COUNT, 1))
    store.set(_entry(index), address)
    return index


def withdraw(store: Any, index: int) -> None:
    """Marks announcement `index` gone, so later readers skip it."""
    store.set(_entry(index), "")


def _read(store: Any, index: int) -> str | None:
    """Entry `index`: its address, "" when withdrawn, None when not set yet."""
    key = _entry(index)
    if not store.check([key]):
        return None
    return store.get(key).decode()


def _count(store: Any) -> int:
    return int(store.add(COUNT, 0))


def discover(store: Any) -> list[str]:
    """The announced, not withdrawn addresses in join order, each once."""
    out: list[str] = []
    for index in range(1, _count(store) + 1):
        address = _read(store, index)
        if address and address not in out:
            out.append(address)
    return out


def raw_store(store: Any) -> Any:
    """The store under any PrefixStores (init_process_group and torchrun wrap theirs)."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


class Watcher:
    """Calls ``callback(address)`` once per address announced, from a thread.

    Addresses already announced when it starts are reported first, in join
    order. A failing store read or callback is logged and retried on the next
    poll: nothing raises into the training loop. ``stop()`` ends the thread
    within one interval.
    """

    def __init__(self, store: Any, callback: Callable[[str], None], interval: float = 1.0) -> None:
        self._store = store
        self._callback = callback
        self._interval = float(interval)
        self._stop = threading.Event()
        self._next = 1  # first index never looked at
        self._pending: list[int] = []  # counted but not set yet
        self._seen: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="dlop-discovery", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        """One look at the store (the thread calls this every interval)."""
        count = _count(self._store)
        candidates = self._pending + list(range(self._next, count + 1))
        self._next = max(self._next, count + 1)
        self._pending = []
        for index in candidates:
            address = _read(self._store, index)
            if address is None:
                self._pending.append(index)
            elif address and address not in self._seen:
                self._seen.add(address)
                try:
                    self._callback(address)
                except Exception:  # the callback's failure is not the watcher's to propagate
                    _log.exception("dlop discovery: the callback for offloader %s failed", address)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except Exception as e:  # a store hiccup (or its end at shutdown): log, try again
                _log.warning("dlop discovery: reading the store failed (%s); retrying", e)
            self._stop.wait(self._interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
