"""The one decision for the job: every window, the trainers' figures from the fleet's
store, the policy in dlop.fleet.scaling.policy, and an actuator to carry the target out.

The controller runs in one process of the job (``dlop run --offloaders auto``
runs it beside rank 0) and needs only the store and its actuator. Each window
it:

1. reads every rank's latest figures (dlop.fleet.scaling.figures) and makes each
   rank's window from the reading before (a rank with no new steps counts as
   a rank without steps);
2. asks :func:`dlop.data.policy.decide` for the target. Until the fleet
   has been the target's size for a busy window (BUSY_WINDOW_SECONDS, plus
   the figures' delay), the offloaders' busy fractions are withheld from it:
   they still cover the fleet before, when new daemons were starting or the
   trainers had stopped to join them, and would make it look idler than it
   is (the policy then shrinks nothing, and sizes by the rates alone);
3. takes the actuator's problems (a job that never started, a daemon that
   died): each is logged, and the policy's target becomes what the actuator
   has, with a cool-down, so that the fleet is grown again, once, only if
   the stall says so;
4. scales the actuator to the target when it differs. When the scheduler
   fails (ActuatorError), the failure is logged, the target becomes what the
   actuator has, and the training goes on with that fleet.

Every decision that changes something, and every problem, is logged as a
line starting ``dlop autoscale:``, kept in :attr:`Controller.decisions`, and
written to the store's decision key.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from dlop.fleet.scaling import policy
from dlop.data.metrics import LoaderStats
from dlop.fleet.scaling import figures
from dlop.fleet.scaling.actuator import Actuator, ActuatorError

_log = logging.getLogger("dlop.fleet.scaling")


@dataclass(frozen=True)
class Decision:
    """One window's outcome."""

    time: float  #: time.monotonic() at the decision
    step: int  #: the job's step
    stall_ratio: float
    live: int  #: the fewest offloaders a rank uses
    target: int  #: the policy's target after the window
    size: int  #: the actuator's size after acting
    why: str


class Controller:
    """Decides the fleet's size every ``window`` seconds. :meth:`tick` runs one window (tests
    call it directly); :meth:`start` runs it from a thread until :meth:`stop`."""

    def __init__(self, store: Any, actuator: Actuator, settings: policy.Settings | None = None,
                 window: float = 2.0, say: Callable[[str], None] | None = None) -> None:
        if window <= 0:
            raise ValueError(f"--window must be above 0 seconds (got {window!r})")
        self.store, self.actuator = store, actuator
        settings = settings or policy.Settings()
        if actuator.capacity is not None and actuator.capacity < settings.max:
            if actuator.capacity < settings.min:
                raise ValueError(f"--min {settings.min}: {actuator.name} has room for {actuator.capacity} "
                                 "offloader(s) only")
            settings = dataclasses.replace(settings, max=actuator.capacity)
        self.settings = settings
        self.window = float(window)
        self.say = say or (lambda line: _log.warning("%s", line))
        s = self.settings
        self.state = policy.State(target=min(s.max, max(s.min, actuator.size())))
        self.decisions: list[Decision] = []
        from dlop._C import offload

        # Busy fractions taken before this are of another fleet (see the module's text).
        self._settle_seconds = offload.BUSY_WINDOW_SECONDS + max(self.window, figures.INTERVAL)
        self._changed = time.monotonic()
        self._before: dict[int, LoaderStats] = {}
        self._step = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _windows(self) -> list[policy.RankWindow]:
        now = figures.read(self.store)
        out = []
        for rank, after in sorted(now.items()):
            before = self._before.get(rank)
            if before is not None and after.steps > before.steps and after.offloaded:
                out.append(policy.RankWindow.from_stats(before, after))
            else:  # its first reading, no step since, or a rank making batches itself: no window
                out.append(policy.RankWindow(rank=rank, step=after.steps, steps=0, step_seconds=0.0,
                                                stall_seconds=0.0, live=after.offloaders_live))
            self._before[rank] = after
        return out

    def _act(self, target: int, step: int, why: str) -> tuple[int, str, bool]:
        """Scales toward target; (the actuator's size after, why, whether it acted or failed)."""
        size = self.actuator.size()
        if target == size:
            return size, why, False
        try:
            did = self.actuator.scale(target)
            return self.actuator.size(), f"{why}; {self.actuator.name}: {did}", True
        except ActuatorError as e:
            size = self.actuator.size()
            # What the scheduler refused waits a cool-down before the policy asks again.
            self.state = dataclasses.replace(self.state, target=max(size, 1), above=0, idle=0, changed_at=step)
            return size, f"{why}; {self.actuator.name} failed: {e}; going on with {size} offloader(s)", True

    def tick(self) -> Decision:
        windows = self._windows()
        job = policy.aggregate(windows)
        self._step = max(self._step, job.step)
        for problem in self.actuator.check():
            size = self.actuator.size()
            self.state = dataclasses.replace(self.state, target=max(min(size, self.settings.max), 1),
                                             above=0, idle=0, changed_at=self._step)
            self.say(f"dlop autoscale: {self.actuator.name}: {problem}; the fleet is {size} now")
        before = self.state.target
        if job.ranks > 0 and job.live != before:
            self._changed = time.monotonic()  # not the target's size yet: joining or draining
        if time.monotonic() - self._changed < self._settle_seconds:
            job = dataclasses.replace(job, busy={address: None for address in job.busy})
        self.state, target, why = policy.decide(self.settings, self.state, job)
        size, why, acted = self._act(target, self._step, why)
        if target != before or acted:
            self._changed = time.monotonic()
        decision = Decision(time.monotonic(), self._step, job.stall_ratio, job.live, self.state.target, size, why)
        self.decisions.append(decision)
        if target != before or acted:
            self.say(f"dlop autoscale: step {decision.step}: {why} (offloaders {size})")
        try:
            self.store.set(figures.DECISION, json.dumps(dataclasses.asdict(decision)))
        except Exception:  # the store is for people to read: its failure changes nothing
            pass
        return decision

    def _run(self) -> None:
        while not self._stop.wait(self.window):
            try:
                self.tick()
            except Exception as e:  # a store hiccup: the next window tries again
                _log.warning("dlop autoscale: this window's decision failed (%s)", e)

    def start(self) -> "Controller":
        self._thread = threading.Thread(target=self._run, name="dlop-autoscale", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
