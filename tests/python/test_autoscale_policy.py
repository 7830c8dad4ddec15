"""dlop.fleet.scaling.policy: the fleet-size policy on recorded traces, its settings, the
aggregation over ranks and the exchange of the ranks' figures over a real c10d store.

A trace is a list of windows of 10 steps, as a rank's OffloadLoader.stats() would
give them: (job step at the window's end, offloaders live, batches/s from each,
their busy fraction or None, mean step seconds, mean stall seconds). Each trace
is written as the job would have measured it with an actuator that follows the
target (offloaders join a window or two after a grow)."""

from __future__ import annotations

import argparse
import random

import pytest

from dlop.fleet.scaling.policy import (JobWindow, RankWindow, Settings, State, add_arguments,
                                 aggregate, decide, estimate, from_arguments)

ADDRESSES = [f"offloader{k}:7001" for k in range(12)]


def window(step, live, rate, busy, step_s, stall_s, *, rank=0, prefetch=16, gone=()):
    """A rank's window: `live` offloaders each delivering `rate` batches/s (the first
    `live` addresses, less those in `gone`, which deliver nothing)."""
    names = [a for a in ADDRESSES if a not in gone][:live]
    return RankWindow(rank=rank, step=step, steps=10, step_seconds=step_s, stall_seconds=stall_s,
                      rates={a: rate for a in names} | {a: 0.0 for a in gone},
                      busy={a: busy for a in names} | {a: None for a in gone}, live=live, prefetch=prefetch)


def run(settings, trace, state=None):
    """Every decision over the trace: [(target, reason)], and the target before each in `.before`."""
    state = state or State()
    out = Decisions()
    for w in trace:
        job = aggregate([w] if isinstance(w, RankWindow) else w)
        before = state.target if state.target is not None else min(settings.max, max(settings.min, job.live))
        state, target, reason = decide(settings, state, [w] if isinstance(w, RankWindow) else w)
        out.before.append(before)
        out.append((target, reason))
    return out


class Decisions(list):
    def __init__(self):
        super().__init__()
        self.before = []


def changes(decisions) -> list[tuple[int, int, int]]:
    """(window index, from, to) of each change of target (the first window's from: its live fleet)."""
    return [(k, b, t) for k, (b, (t, _)) in enumerate(zip(decisions.before, decisions)) if b != t]


# --- the traces -------------------------------------------------------------------------------------

# The trainer computes a step in 25 ms (40 batches/s). 3 offloaders make 20 batches/s each until the
# per-sample cost doubles at step 60 (10 each: the job gets 30/s, a step of 33.3 ms of which 8.3 ms is
# stall, 25%). The policy grows to ceil(40 x 1.2 / 10) = 5; the two new ones join at step 110.
# Busy fractions are unknown, as daemons do not report them yet.
STALL_STEPS_UP = (
    [window(s, 3, 13.33, None, 0.025, 0.0002) for s in (10, 20, 30, 40, 50, 60)]
    + [window(s, 3, 10.0, None, 0.0333, 0.0083) for s in (70, 80, 90)]  # the third one above target decides
    + [window(s, 3, 10.0, None, 0.0333, 0.0083) for s in (100,)]  # the new ones are starting
    + [window(s, 5, 8.0, None, 0.025, 0.0003) for s in range(110, 400, 10)]
)


def test_a_stall_that_steps_up_grows_the_fleet_to_its_size_then_stops():
    got = run(Settings(), STALL_STEPS_UP)
    assert changes(got) == [(8, 3, 5)], got  # at step 90, the third window above target
    assert "growing 3 -> 5" in got[8][1] and "estimate 5" in got[8][1]
    assert "cool-down until step 120" in got[9][1]  # the two new ones are starting
    assert [t for t, _ in got[9:]] == [5] * len(got[9:])


# A fleet of 4 makes just enough for 25 ms steps: the stall wanders around the 2% target, never above
# it three windows in a row, and the offloaders stay busy (70-95%), above the shrink threshold.
NOISY_RATIOS = [0.025, 0.015, 0.031, 0.022, 0.012, 0.028, 0.019, 0.024, 0.026, 0.010, 0.021, 0.017,
                0.034, 0.008, 0.023, 0.029, 0.016, 0.027, 0.021, 0.013, 0.030, 0.011, 0.024, 0.022,
                0.018, 0.026, 0.033, 0.014, 0.020, 0.025, 0.019, 0.028, 0.015, 0.023, 0.031, 0.017]
NOISY_BUSY = [0.70 + 0.25 * ((k * 7) % 11) / 10 for k in range(len(NOISY_RATIOS))]
NOISY_STALL = [window(10 * (k + 1), 4, 10.0, NOISY_BUSY[k], 0.025, 0.025 * r) for k, r in enumerate(NOISY_RATIOS)]


def test_a_noisy_stall_around_the_target_does_not_flap():
    assert max(NOISY_BUSY) <= 0.95 and min(NOISY_BUSY) >= 0.7
    got = run(Settings(), NOISY_STALL)
    assert changes(got) == [], got
    # Without hysteresis the same trace moves the fleet at once: hysteresis is what holds it.
    assert changes(run(Settings(hysteresis=1), NOISY_STALL))


def test_random_noise_never_reverses_the_fleet():
    """200 windows of a stall drawn uniformly from 0-4% of the step (mean: the target) and busy
    fractions from 55-95%: the fleet may grow (once three draws in a row exceed 2%), and never flaps
    back."""
    rng = random.Random(46)
    trace = [window(10 * (k + 1), 4, 10.0, rng.uniform(0.55, 0.95), 0.025, 0.025 * rng.uniform(0.0, 0.04))
             for k in range(200)]
    got = run(Settings(), trace)
    moves = changes(got)
    assert len(moves) <= 1 and all(b > a for _, a, b in moves), moves


# 4 offloaders make 25 batches/s each; the job needs 80 (12.5 ms steps), so they deliver 20 each and
# are 80% busy. At step 60 one dies: 3 deliver 75/s, the step stretches to 13.3 ms (6% stall). The
# actuator starts a replacement, which delivers from step 110 on.
DEAD = "offloader3:7001"
AN_OFFLOADER_DIES = (
    [window(s, 4, 20.0, 0.8, 0.0125, 0.0001) for s in (10, 20, 30, 40, 50)]
    + [window(s, 3, 25.0, 1.0, 0.01333, 0.00083, gone=(DEAD,)) for s in (60, 70, 80, 90, 100)]
    + [window(s, 4, 20.0, 0.8, 0.0125, 0.0001, gone=(DEAD,)) for s in range(110, 300, 10)]
)


def test_an_offloader_that_dies_is_replaced_and_nothing_else_moves():
    got = run(Settings(), AN_OFFLOADER_DIES)
    assert [t for t, _ in got] == [4] * len(got)  # the target holds at 4 ...
    for k in range(5, 10):  # ... above the 3 live: the actuator grows the fleet back
        assert "waiting for 1 offloader(s) to join (live 3)" in got[k][1], got[k]
    assert changes(got) == []


def test_a_policy_that_starts_after_the_death_grows_the_fleet_back():
    """Started with 3 live (no earlier target), the stall grows it to ceil(80 x 1.2 / 25) = 4."""
    got = run(Settings(), AN_OFFLOADER_DIES[5:8] + AN_OFFLOADER_DIES[10:])
    assert changes(got) == [(2, 3, 4)], got
    assert "growing 3 -> 4" in got[2][1]


# 4 offloaders of 25 batches/s feed 12.5 ms steps (80/s, 80% busy). At step 50 the model's step gets
# faster, 8 ms (125/s needed): the fleet gives 100/s, a 10 ms step with 2 ms of stall (20%). The
# policy grows to ceil(125 x 1.2 / 25) = 6, which join at step 100.
A_STEP_GETS_FASTER = (
    [window(s, 4, 20.0, 0.8, 0.0125, 0.0001) for s in (10, 20, 30, 40)]
    + [window(s, 4, 25.0, 1.0, 0.010, 0.002) for s in (50, 60, 70, 80, 90)]
    + [window(s, 6, 20.83, 0.83, 0.008, 0.0001) for s in range(100, 300, 10)]
)


def test_a_step_that_gets_faster_grows_the_fleet():
    got = run(Settings(), A_STEP_GETS_FASTER)
    assert changes(got) == [(6, 4, 6)], got
    assert "growing 4 -> 6" in got[6][1]


# 6 offloaders of 25 batches/s feed 8 ms steps (125/s, 83% busy). At step 50 the pipeline gets 4x
# cheaper: each could make 100/s, so they deliver 20.8 each at 21% busy. The estimate is
# ceil(125 x 1.2 / 100) = 2; the policy shrinks, not below --min. The leavers go at step 110.
def cheap_pipeline(left):
    return ([window(s, 6, 20.83, 0.83, 0.008, 0.0001) for s in (10, 20, 30, 40)]
            + [window(s, 6, 20.83, 0.21, 0.008, 0.0001) for s in (50, 60, 70, 80, 90, 100)]
            + [window(s, left, 125 / left, 1.25 / left, 0.008, 0.0001) for s in range(110, 300, 10)])


def test_a_pipeline_that_gets_cheap_shrinks_the_fleet_not_below_min():
    got = run(Settings(min=3), cheap_pipeline(3))
    assert changes(got) == [(6, 6, 3)], got  # at step 70, the third idle window
    assert "shrinking 6 -> 3" in got[6][1]
    assert "the fleet is at --min 3" in got[-1][1]  # 3 at 42% busy: still idle, but at the floor
    got = run(Settings(min=1), cheap_pipeline(2))
    assert changes(got) == [(6, 6, 2)], got  # 2 at 62% busy: not idle, and enough
    assert got[-1][0] == 2


def test_without_busy_fractions_the_fleet_never_shrinks():
    trace = [window(10 * k, 6, 5.0, None, 0.033, 0.0) for k in range(1, 30)]
    got = run(Settings(), trace)
    assert changes(got) == [] and got[-1][0] == 6


def test_a_stall_the_fleet_cannot_fix_holds_the_fleet():
    """Idle offloaders with a stall (the trainer's own decoding, say) grow nothing; nor does a fleet
    as big as the leases the ranks keep out at once (two ranks of prefetch 2)."""
    idle = [window(10 * k, 4, 5.0, 0.2, 0.05, 0.025) for k in range(1, 10)]
    got = run(Settings(), idle)
    assert changes(got) == [] and "the bottleneck is not the fleet" in got[-1][1]
    leased = [[window(10 * k, 4, 2.5, 1.0, 0.1, 0.05, rank=r, prefetch=2) for r in (0, 1)] for k in range(1, 10)]
    got = run(Settings(), leased)
    assert changes(got) == [] and "only 4 leases out at once" in got[-1][1]


def test_growth_stops_at_max_and_waits_out_the_cool_down():
    # 1 offloader of 10/s for a trainer that needs 100/s: the estimate (12) is above --max 4.
    trace = [window(10 * k, 1, 10.0, 1.0, 0.1, 0.09) if k < 5 else window(10 * k, 4, 10.0, 1.0, 0.025, 0.015)
             for k in range(1, 20)]
    got = run(Settings(max=4, cooldown_steps=30), trace)
    assert changes(got) == [(2, 1, 4)], got
    assert "cool-down until step 60" in got[3][1]
    assert "at --max 4" in got[-1][1]


def test_the_first_window_adopts_the_live_fleet_within_min_and_max():
    state, target, _ = decide(Settings(min=2, max=5), State(), [window(10, 1, 10.0, None, 0.1, 0.0)])
    assert target == 2 and state.target == 2
    state, target, _ = decide(Settings(min=2, max=5), State(), [window(10, 8, 10.0, None, 0.1, 0.0)])
    assert target == 5
    state, target, reason = decide(Settings(), State(target=3), [RankWindow(0, 10, 0, 0.0, 0.0)])
    assert target == 3 and "no steps" in reason


# --- a closed loop, as a sanity check of the traces' premise ----------------------------------------

def test_a_fleet_that_follows_the_target_settles_without_flapping():
    """A job whose offloaders join one window after each decision, across workloads (per-offloader
    rate 5-40 batches/s, steps needing 20-200 batches/s) with 10% noise: from 1 offloader the fleet
    only ever grows, and settles with the stall under target."""
    rng = random.Random(7)
    settings = Settings(max=64)
    for capacity in (5.0, 12.0, 40.0):
        for need in (20.0, 75.0, 200.0):
            state, live, target, targets, ratios = State(), 1, 1, [], []
            for k in range(1, 80):
                c = capacity * rng.uniform(0.9, 1.1)
                made = min(need, live * c)
                step = 1 / made
                stall = max(0.0, step - 1 / need) + 0.0005 * rng.random() * step
                w = window(10 * k, live, made / live, made / (live * c), step, stall, prefetch=64)
                state, new, _ = decide(settings, state, [w])
                live, target = target, new  # the actuator needs a window to start them
                targets.append(new)
                ratios.append(stall / step)
            assert all(b >= a for a, b in zip(targets, targets[1:])), (capacity, need, targets)
            assert max(ratios[-10:]) <= settings.stall_target, (capacity, need, targets, ratios[-10:])


# --- aggregation over ranks --------------------------------------------------------------------------

def test_the_ranks_figures_aggregate_into_one_window():
    a = RankWindow(0, 100, 10, 0.10, 0.01, {"x:1": 4.0, "y:1": 3.0}, {"x:1": 0.5, "y:1": None}, 2, 4)
    b = RankWindow(1, 102, 10, 0.11, 0.03, {"x:1": 5.0, "y:1": 2.0}, {"x:1": 0.7, "y:1": None}, 1, 4)
    c = RankWindow(2, 90, 0, 0.0, 0.0, {"x:1": 0.0}, {}, 2, 4)  # stepped nothing: left out
    job = aggregate([a, b, c])
    assert job == JobWindow(step=102, ranks=2, step_seconds=0.11, stall_seconds=0.03,
                            rates={"x:1": 9.0, "y:1": 5.0}, busy={"x:1": 0.7, "y:1": None}, live=1, leases=8)
    assert job.stall_ratio == pytest.approx(0.03 / 0.11)
    assert job.needed_rate == pytest.approx(2 / 0.08)  # two ranks, 80 ms of work a step each
    # y's busy fraction is unknown: its rate is its capacity's lower bound.
    assert estimate(Settings(headroom=1.0), job) == 3  # ceil(25 / mean(9 / 0.7, 5)) = ceil(2.8)
    assert aggregate([a, RankWindow(1, 5, 10, 0.1, 0.0, prefetch=None)]).leases is None


def test_a_rank_window_between_two_stats_of_a_loader():
    from dlop.data.metrics import Recorder

    r = Recorder(rank=1, prefetch=4)
    r.add_address("x:1")
    r.step(0.0, 0.5)
    before = r.stats()
    for k in range(1, 5):
        r.step(0.5 * k + 0.4, 0.5 * k + 0.5)  # 0.1 s stall in each 0.5 s step
    after = r.stats()
    w = RankWindow.from_stats(before, after)
    assert (w.rank, w.step, w.steps, w.live, w.prefetch) == (1, 5, 4, 0, 4)
    assert w.step_seconds == pytest.approx(0.5) and w.stall_seconds == pytest.approx(0.1)
    assert w.rates == {"x:1": 0.0} and w.busy == {"x:1": None}
    assert RankWindow.from_json(w.to_json()) == w


# --- settings ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, option", [
    ({"min": 0}, "--min"),
    ({"min": -2, "max": 3}, "--min"),
    ({"max": -1}, "--max"),
    ({"min": 4, "max": 3}, "--max"),
    ({"stall_target": 0.0}, "--stall-target"),
    ({"stall_target": -0.02}, "--stall-target"),
    ({"stall_target": 1.5}, "--stall-target"),
    ({"stall_target": float("nan")}, "--stall-target"),
    ({"busy_threshold": -0.1}, "--busy-threshold"),
    ({"busy_threshold": 1.2}, "--busy-threshold"),
    ({"headroom": 0.9}, "--headroom"),
    ({"hysteresis": 0}, "--hysteresis"),
    ({"hysteresis": 1.5}, "--hysteresis"),
    ({"cooldown_steps": -1}, "--cooldown-steps"),
])
def test_bad_settings_raise_naming_the_option(bad, option):
    with pytest.raises(ValueError, match=option):
        Settings(**bad)


def test_settings_from_the_command_line():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_arguments(parser.parse_args([])) == Settings()
    got = from_arguments(parser.parse_args(["--min", "2", "--max", "9", "--stall-target", "0.05",
                                            "--cooldown-steps", "100"]))
    assert got == Settings(min=2, max=9, stall_target=0.05, cooldown_steps=100)
    with pytest.raises(ValueError, match=r"--max \(2\) is below --min \(3\)"):
        from_arguments(parser.parse_args(["--min", "3", "--max", "2"]))


# --- the exchange over a c10d store ----------------------------------------------------------------------
