"""How many offloaders a job needs: a pure policy over the trainers' data-loading figures.

Every rank reports a :class:`RankWindow` per decision window (its mean step
and stall, the batches per second it got from each offloader, their busy
fractions where known, the offloaders it still uses).
:mod:`dlop.fleet.scaling.figures` carries them over the fleet's c10d store to
the controller, :func:`aggregate` makes one :class:`JobWindow` of them, and :func:`decide`
turns it into one target fleet size for the job. An actuator (local
processes, SLURM jobs, a Kubernetes Deployment) starts or stops offloaders
to reach the target; nothing here starts anything.

The rule, for a job of R ranks:

* the job's step and stall are the largest of the ranks' (a synchronous
  step goes at the pace of the rank that waits longest for data); the stall
  ratio is stall / step;
* the job needs R / (step - stall) batches per second: what the ranks
  would consume if no rank waited for data;
* an offloader makes rate / busy batches per second when busy (rate alone
  when its busy fraction is unknown: a lower bound, exact while the fleet
  is saturated, which a stall says it is); the estimate is
  ceil(needed x headroom / the mean of that over the offloaders that
  delivered);
* **grow** once the stall ratio stays above ``stall_target`` for
  ``hysteresis`` windows in a row: to the estimate, or one more when the
  estimate is not above the target; never beyond ``max``, nor beyond the
  leases the ranks keep out at once (their ``prefetch`` summed: more
  offloaders than leases sit idle), nor while the offloaders report
  themselves idle (the bottleneck is elsewhere);
* **shrink** once every offloader's busy fraction stays under
  ``busy_threshold`` with no stall for ``hysteresis`` windows: to the
  estimate, never below ``min``. Without busy fractions it never shrinks;
* while fewer offloaders are live than the target (one died, or has not
  joined yet) the target holds: the actuator is replacing them;
* after a change nothing changes for ``cooldown_steps`` steps. Windows
  of a cool-down or of a short fleet count toward no streak.

Growing needs a stall, shrinking needs idle offloaders and no stall, and
both aim at the same estimate: between the two conditions the target
holds, so it does not flap.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

# Each setting's command-line option, as errors name it.
OPTIONS = {
    "min": "--min",
    "max": "--max",
    "stall_target": "--stall-target",
    "busy_threshold": "--busy-threshold",
    "headroom": "--headroom",
    "hysteresis": "--hysteresis",
    "cooldown_steps": "--cooldown-steps",
}


@dataclass(frozen=True)
class Settings:
    """The policy's settings; a bad one raises ValueError naming its option."""

    min: int = 1  #: offloaders at least
    max: int = 16  #: offloaders at most
    stall_target: float = 0.02  #: the data stall the job accepts, as a fraction of its step
    busy_threshold: float = 0.5  #: shrink when every offloader is busier than this for less of its time
    headroom: float = 1.2  #: the estimate's margin over the rate the job needs
    hysteresis: int = 3  #: windows in a row a condition must hold before a change
    cooldown_steps: int = 30  #: steps after a change before the next one

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{OPTIONS[name]} {why} (got {getattr(self, name)!r})")

        for name in ("min", "max", "hysteresis", "cooldown_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(name, "must be a whole number")
        for name in ("stall_target", "busy_threshold", "headroom"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad(name, "must be a number")
        if self.min < 1:
            raise bad("min", "must be at least 1 (a job with no offloader has no rate to measure)")
        if self.max < self.min:
            raise ValueError(f"--max ({self.max}) is below --min ({self.min})")
        if not 0 < self.stall_target < 1:
            raise bad("stall_target", "must be a fraction of the step, above 0 and below 1")
        if not 0 < self.busy_threshold <= 1:
            raise bad("busy_threshold", "must be a fraction, above 0 and at most 1")
        if self.headroom < 1:
            raise bad("headroom", "must be at least 1")
        if self.hysteresis < 1:
            raise bad("hysteresis", "must be at least 1 window")
        if self.cooldown_steps < 0:
            raise bad("cooldown_steps", "must not be negative")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The settings as options of ``parser`` (:func:`from_arguments` reads them back)."""
    d = Settings()
    parser.add_argument("--min", type=int, default=d.min, help=f"offloaders at least (default {d.min})")
    parser.add_argument("--max", type=int, default=d.max, help=f"offloaders at most (default {d.max})")
    parser.add_argument("--stall-target", type=float, default=d.stall_target,
                        help=f"the data stall accepted, as a fraction of the step (default {d.stall_target})")
    parser.add_argument("--busy-threshold", type=float, default=d.busy_threshold,
                        help=f"shrink when every offloader is busy less than this (default {d.busy_threshold})")
    parser.add_argument("--headroom", type=float, default=d.headroom,
                        help=f"margin over the rate the job needs (default {d.headroom})")
    parser.add_argument("--hysteresis", type=int, default=d.hysteresis,
                        help=f"windows in a row a condition must hold (default {d.hysteresis})")
    parser.add_argument("--cooldown-steps", type=int, default=d.cooldown_steps,
                        help=f"steps after a change before the next (default {d.cooldown_steps})")


def from_arguments(args: argparse.Namespace) -> Settings:
    return Settings(**{name: getattr(args, name) for name in OPTIONS})


@dataclass(frozen=True)
class RankWindow:
    """What one rank measured over one decision window."""

    rank: int
    step: int  #: the rank's step count at the window's end
    steps: int  #: steps in the window
    step_seconds: float  #: mean step (stall included)
    stall_seconds: float  #: mean data stall per step
    rates: Mapping[str, float] = field(default_factory=dict)  #: batches/s each offloader delivered to this rank
    busy: Mapping[str, float | None] = field(default_factory=dict)  #: each offloader's busy fraction, None: unknown
    live: int = 0  #: offloaders this rank still uses
    prefetch: int | None = None  #: leases this rank keeps out at once

    @classmethod
    def from_stats(cls, before: Any, after: Any) -> "RankWindow":
        """The window between two ``OffloadLoader.stats()`` of one rank (dlop.data.metrics.LoaderStats)."""
        steps = after.steps - before.steps
        span = after.time - before.time
        done = {o.address: o.batches for o in before.offloaders}
        rates = {o.address: (o.batches - done.get(o.address, 0)) / span if span > 0 else 0.0
                 for o in after.offloaders}
        return cls(
            rank=after.rank, step=after.steps, steps=steps,
            step_seconds=(after.step_seconds_total - before.step_seconds_total) / steps if steps else 0.0,
            stall_seconds=(after.stall_seconds_total - before.stall_seconds_total) / steps if steps else 0.0,
            rates=rates, busy={o.address: o.busy_fraction for o in after.offloaders},
            live=after.offloaders_live, prefetch=after.prefetch or None,
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "RankWindow":
        return cls(**json.loads(text))


@dataclass(frozen=True)
class JobWindow:
    """The job's window, made of every rank's by :func:`aggregate`."""

    step: int  #: the job's step at the window's end (the furthest rank's)
    ranks: int  #: ranks that stepped in the window
    step_seconds: float  #: the largest of the ranks' mean steps
    stall_seconds: float  #: the largest of the ranks' mean stalls
    rates: Mapping[str, float] = field(default_factory=dict)  #: per offloader, summed over the ranks
    busy: Mapping[str, float | None] = field(default_factory=dict)  #: per offloader, the largest any rank knows
    live: int = 0  #: the fewest offloaders any rank still uses
    leases: int | None = None  #: leases out at once over the job (None: a rank did not say)

    @property
    def stall_ratio(self) -> float:
        return self.stall_seconds / self.step_seconds if self.step_seconds > 0 else 0.0

    @property
    def needed_rate(self) -> float:
        """Batches per second the ranks would consume if none waited for data."""
        work = self.step_seconds - self.stall_seconds
        return self.ranks / work if work > 0 else math.inf


def aggregate(windows: Sequence[RankWindow]) -> JobWindow:
    """One window for the job: step and stall the largest of the ranks' (a synchronous step
    waits for the slowest rank), rates summed per offloader (each rank leases its own
    batches), busy fractions the largest known, live offloaders the fewest any rank has
    (one a rank lost does not feed it). Ranks without steps in the window are left out."""
    stepped = [w for w in windows if w.steps > 0]
    rates: dict[str, float] = {}
    busy: dict[str, float | None] = {}
    for w in stepped:
        for address, rate in w.rates.items():
            rates[address] = rates.get(address, 0.0) + rate
        for address, b in w.busy.items():
            if b is not None and (busy.get(address) is None or b > busy[address]):
                busy[address] = b
            else:
                busy.setdefault(address, None)
    leases = None if not stepped or any(w.prefetch is None for w in stepped) else sum(w.prefetch for w in stepped)
    return JobWindow(
        step=max((w.step for w in windows), default=0),
        ranks=len(stepped),
        step_seconds=max((w.step_seconds for w in stepped), default=0.0),
        stall_seconds=max((w.stall_seconds for w in stepped), default=0.0),
        rates=rates, busy=busy,
        live=min((w.live for w in stepped), default=0),
        leases=leases,
    )


@dataclass(frozen=True)
class State:
    """What :func:`decide` carries from one window to the next (start with ``State()``)."""

    target: int | None = None  #: None: the first window's live fleet, within min and max
    above: int = 0  #: windows in a row with the stall above target
    idle: int = 0  #: windows in a row with every offloader under the busy threshold and no stall
    changed_at: int | None = None  #: the job step of the last change


def estimate(settings: Settings, window: JobWindow) -> int | None:
    """Offloaders that make the batches the job needs, with headroom; None when none delivered."""
    capacities = []
    for address, rate in window.rates.items():
        if rate <= 0:
            continue  # a dead or idle offloader says nothing of what one makes
        b = window.busy.get(address)
        capacities.append(rate / b if b is not None and b > 0 else rate)
    if not capacities:
        return None
    per = sum(capacities) / len(capacities)
    need = window.needed_rate
    if math.isinf(need):
        return None
    return max(1, math.ceil(need * settings.headroom / per - 1e-9))


def decide(settings: Settings, state: State,
           measurements: JobWindow | Sequence[RankWindow]) -> tuple[State, int, str]:
    """One decision: (the state for the next window, the target fleet size, why).
    ``measurements``: the job's window, or every rank's (aggregated by :func:`aggregate`)."""
    s = settings
    m = measurements if isinstance(measurements, JobWindow) else aggregate(measurements)
    clamp = lambda n: min(s.max, max(s.min, n))  # noqa: E731
    if state.target is None:
        state = dataclasses.replace(state, target=clamp(m.live))
    current = state.target
    if m.ranks == 0 or m.step_seconds <= 0:
        return state, current, "no steps in the window: holding"

    ratio = m.stall_ratio
    delivering = [a for a, r in m.rates.items() if r > 0]
    busy = [m.busy.get(a) for a in delivering]
    known = bool(delivering) and all(b is not None for b in busy)
    busiest = max(busy) if known else None
    stalled = ratio > s.stall_target
    idle = not stalled and known and busiest < s.busy_threshold
    figures = f"stall {ratio:.1%} of the step (target {s.stall_target:.1%})"
    if known:
        figures += f", offloaders busy {busiest:.0%} at most"

    cooling_until = None if state.changed_at is None else state.changed_at + s.cooldown_steps
    if cooling_until is not None and m.step < cooling_until:
        # The fleet is still turning over: these windows count toward nothing.
        return dataclasses.replace(state, above=0, idle=0), current, f"{figures}; cool-down until step {cooling_until}"

    if m.live < current:
        # An offloader died or has not joined yet: the actuator is replacing it, and the
        # stall it causes says nothing of the target. These windows count toward nothing.
        return (dataclasses.replace(state, above=0, idle=0), current,
                f"{figures}; waiting for {current - m.live} offloader(s) to join (live {m.live})")

    above = state.above + 1 if stalled else 0
    idle_for = state.idle + 1 if idle else 0
    state = dataclasses.replace(state, above=above, idle=idle_for)
    want = estimate(s, m)
    new, reason = current, None

    if above >= s.hysteresis:
        if known and busiest < s.busy_threshold:
            reason = (f"{figures} for {above} windows, but the offloaders are idle: "
                      "the bottleneck is not the fleet; holding")
        else:
            limit = min(s.max, m.leases) if m.leases is not None else s.max
            new = max(current, min(max(current + 1, want or 0), limit))
            if new > current:
                reason = f"{figures} for {above} windows; estimate {want}: growing {current} -> {new}"
            elif m.leases is not None and current >= m.leases and m.leases < s.max:
                reason = (f"{figures}, but the ranks keep only {m.leases} leases out at once: "
                          "more offloaders would sit idle (raise the loaders' prefetch); holding")
            else:
                reason = f"{figures} for {above} windows, but the fleet is at --max {s.max}; holding"
    elif idle_for >= s.hysteresis:
        new = min(current, clamp(want if want is not None else current))
        if new < current:
            reason = f"{figures} for {idle_for} windows; estimate {want}: shrinking {current} -> {new}"
        elif current <= s.min:
            reason = f"{figures}; the fleet is at --min {s.min}; holding"
        else:
            reason = f"{figures}; estimate {want} needs all {current}; holding"
    else:
        reason = f"{figures}; holding"
        if stalled:
            reason += f" (above target {above} of {s.hysteresis} windows)"
        elif idle:
            reason += f" (idle {idle_for} of {s.hysteresis} windows)"

    if new != current:
        state = State(target=new, above=0, idle=0, changed_at=m.step)
    return state, new, reason


__all__ = ["OPTIONS", "Settings", "add_arguments", "from_arguments", "RankWindow", "JobWindow", "aggregate",
           "State", "estimate", "decide"]
