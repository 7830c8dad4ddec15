"""The trainers' figures on their way to the controller, over the fleet's c10d store.

Key layout (one place defines it):

    dlop/autoscale/world          the job's ranks, as the first publisher saw them
    dlop/autoscale/figures/<r>    rank r's latest figures: its loader's
                                  LoaderStats (cumulative), as JSON
    dlop/autoscale/decision       the controller's last decision, as JSON
                                  (target, size, why): for people and logs

Each rank overwrites its own key every ``interval`` seconds
(:class:`Publisher`); the controller reads them all each window
(:func:`read`) and makes each rank's window from two readings
(dlop.data.policy.RankWindow.from_stats). A rank that stops publishing
simply stops counting: nobody waits on a key.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import Any, Callable

from dlop.data.metrics import LoaderStats, OffloaderStats

PREFIX = "dlop/autoscale/"
WORLD = PREFIX + "world"
DECISION = PREFIX + "decision"

_log = logging.getLogger("dlop.fleet.scaling")


def figures_key(rank: int) -> str:
    return f"{PREFIX}figures/{int(rank)}"


def encode(stats: LoaderStats) -> str:
    return json.dumps(dataclasses.asdict(stats), sort_keys=True)


def decode(text: str | bytes) -> LoaderStats:
    fields = json.loads(text)
    fields["offloaders"] = tuple(OffloaderStats(**o) for o in fields.get("offloaders", ()))
    return LoaderStats(**fields)


def read(store: Any) -> dict[int, LoaderStats]:
    """Every rank's latest figures, by rank (those not published yet are missing); ValueError naming
    the key of one that does not decode."""
    if not store.check([WORLD]):
        return {}
    world = int(store.get(WORLD))
    keys = {r: figures_key(r) for r in range(world)}
    out = {}
    for rank, key in keys.items():
        if store.check([key]):
            try:
                out[rank] = decode(store.get(key))
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"rank {rank}'s figures under {key} in the fleet's store are malformed ({e})") from None
    return out


INTERVAL = 1.0  #: seconds between a rank's publications, by default


class Publisher:
    """Publishes ``stats()`` (a LoaderStats, or None while there is nothing to say) as rank
    ``rank`` of ``world`` every ``interval`` seconds, from a daemon thread. A store that fails
    is logged once and tried again: nothing raises into the training loop."""

    def __init__(self, store: Any, rank: int, world: int, stats: Callable[[], LoaderStats | None],
                 interval: float = INTERVAL) -> None:
        self.store, self.rank, self.world, self._stats = store, int(rank), int(world), stats
        self.interval = float(interval)
        self._stop = threading.Event()
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="dlop-autoscale-publish", daemon=True)
        self._thread.start()

    def publish(self) -> None:
        stats = self._stats()
        if stats is None:
            return
        if self.rank == 0 or not self.store.check([WORLD]):
            self.store.set(WORLD, str(self.world))
        self.store.set(figures_key(self.rank), encode(stats))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.publish()
                self._failed = False
            except Exception as e:  # the store is gone or hiccuped: the training goes on
                if not self._failed:
                    _log.warning("dlop autoscale: publishing rank %d's figures failed (%s); retrying", self.rank, e)
                self._failed = True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
