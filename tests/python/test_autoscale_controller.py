"""The controller between the trainers' figures and a real actuator: figures written to a
real c10d store as the trainers' publishers write them, real daemons started and stopped by
the local actuator, and `dlop run --offloaders auto`'s argument checks."""

from __future__ import annotations

import os
import signal
import stat
import time

import pytest

torch = pytest.importorskip("torch")

from processes import offloader, wait_for  # noqa: E402

from dlop.fleet import discovery  # noqa: E402
from dlop.data.metrics import LoaderStats, OffloaderStats  # noqa: E402
from dlop.fleet.local import token_folder  # noqa: E402
from dlop.fleet.run import environment  # noqa: E402
from dlop.fleet.scaling import figures, policy  # noqa: E402
from dlop.fleet.scaling.controller import Controller  # noqa: E402
from dlop.fleet.scaling.local import LocalActuator  # noqa: E402


def _stats(rank: int, steps: int, step: float, stall: float, offloaders: dict[str, int],
           busy: float | None = None) -> LoaderStats:
    """What OffloadLoader.stats() says after `steps` steps of `step` seconds, `stall` of them waiting."""
    return LoaderStats(
        rank=rank, offloaded=True, time=steps * step, steps=steps, stall_seconds_total=steps * stall,
        step_seconds_total=steps * step, last_stall_seconds=stall, last_step_seconds=step, window_seconds=0.0,
        window_steps=0, stall_seconds=stall, step_seconds=step, stall_ratio=stall / step, batches_in_flight=2,
        prefetch=4, offloaders_live=len(offloaders), leases_issued=steps, leases_reissued=0,
        offloaders=tuple(OffloaderStats(a, n, 0.0, busy) for a, n in offloaders.items()))


@pytest.fixture()
def fleet():
    offloader()
    store = torch.distributed.HashStore()
    folder, token_file = token_folder()
    actuator = LocalActuator(store, token_file, cores=4)
    said: list[str] = []
    yield store, actuator, said
    actuator.close()
    os.remove(token_file)
    os.rmdir(folder)


def _publish(store, world: int, windows: list[LoaderStats]) -> None:
    store.set(figures.WORLD, str(world))
    for s in windows:
        store.set(figures.figures_key(s.rank), figures.encode(s))


def test_a_stall_on_every_rank_grows_the_fleet_and_the_new_daemons_are_announced(fleet):
    store, actuator, said = fleet
    actuator.scale(1)
    (first,) = actuator.addresses
    c = Controller(store, actuator, policy.Settings(max=4, hysteresis=2, cooldown_steps=5), window=1, say=said.append)
    # Two ranks, a 0.1 s step half of which waits for data; the one daemon makes 10 batches/s for them both.
    for k in range(4):
        steps = 10 * (k + 1)
        _publish(store, 2, [_stats(r, steps, 0.1, 0.05, {first: steps}) for r in range(2)])
        d = c.tick()
    # Needed: 2 ranks / 0.05 s of work = 40 batches/s; one daemon makes 20/s: 40 x 1.2 / 20 -> 3.
    assert d.target == 3 and actuator.size() == 3, said
    assert len(said) == 1 and "growing 1 -> 3" in said[0] and "local: started 2 daemon(s)" in said[0]
    assert discovery.discover(store) == actuator.addresses
    assert all(figures.decode(figures.encode(s)) == s for s in [_stats(0, 3, 0.1, 0.0, {first: 3}, busy=0.25)])


def test_busy_fractions_count_only_once_they_cover_the_present_fleet(fleet):
    store, actuator, said = fleet
    actuator.scale(2)
    a, b = actuator.addresses
    c = Controller(store, actuator, policy.Settings(max=4, hysteresis=2, cooldown_steps=0), window=1, say=said.append)

    def window(k: int):
        # No stall; each daemon made 5 of the 10 batches/s the rank took and says it was busy 10% of its last seconds.
        _publish(store, 1, [_stats(0, 10 * (k + 1), 0.1, 0.0, {a: 5 * (k + 1), b: 5 * (k + 1)}, busy=0.1)])
        return c.tick()

    # The fleet has just become 2: those seconds may be of the fleet before, so they shrink nothing.
    decisions = [window(k) for k in range(4)]
    assert [d.target for d in decisions] == [2] * 4 and actuator.size() == 2 and not said, said
    from dlop._C import offload

    time.sleep(offload.BUSY_WINDOW_SECONDS + 1.5)
    c.tick()  # no new figures: a window without steps says nothing of the fleet's size
    decisions = [window(k) for k in range(4, 7)]
    # 10 batches/s x 1.2 over 5 / 0.1 = 50 per daemon: one is enough.
    assert decisions[-1].target == 1 and actuator.size() == 1, said
    assert len(said) == 1 and "offloaders busy 10% at most for 2 windows; estimate 1: shrinking 2 -> 1" in said[0]


def test_a_dead_daemon_is_reported_and_the_target_falls_to_the_fleet_left(fleet):
    store, actuator, said = fleet
    actuator.scale(2)
    c = Controller(store, actuator, policy.Settings(max=4), window=1, say=said.append)
    victim = actuator.daemons[1]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    d = c.tick()
    assert actuator.size() == 1 and d.target == 1
    assert any(f"daemon {victim.address}" in line and "exited with status -9" in line for line in said), said
    assert victim.address not in discovery.discover(store)  # withdrawn: no trainer joins it again


def test_a_scheduler_failure_is_named_and_the_fleet_goes_on(fleet, tmp_path, monkeypatch):
    store, actuator, said = fleet
    actuator.scale(1)
    (first,) = actuator.addresses
    broken = tmp_path / "dlop-offloader"
    broken.write_text("#!/bin/sh\necho 'dlop-offloader: no room on this host' >&2\nexit 7\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("DLOP_OFFLOADER", str(broken))
    c = Controller(store, actuator, policy.Settings(max=4, hysteresis=1, cooldown_steps=100), window=1,
                   say=said.append)
    for k in range(2):
        steps = 10 * (k + 1)
        _publish(store, 1, [_stats(0, steps, 0.1, 0.05, {first: steps})])
        d = c.tick()
    assert actuator.size() == 1 and d.size == 1 and d.target == 1
    (line,) = said
    assert "local failed: started 0 of" in line and "exit status 7" in line and "going on with 1 offloader(s)" in line
    # The cool-down keeps it from asking again at once.
    _publish(store, 1, [_stats(0, 30, 0.1, 0.05, {first: 30})])
    assert "cool-down" in c.tick().why and len(said) == 1


def test_draining_stops_the_newest_daemon_with_sigterm_and_it_exits_0(fleet):
    store, actuator, said = fleet
    actuator.scale(2)
    newest = actuator.daemons[-1]
    assert "draining 1 daemon(s)" in actuator.scale(1)
    wait_for(lambda: newest.proc.poll() is not None, 30, "the drained daemon to exit")
    assert newest.proc.returncode == 0 and actuator.check() == []
    assert discovery.discover(store) == actuator.addresses


@pytest.mark.parametrize("args, message", [
    (["--min", "3", "--max", "2"], "--max (2) is below --min (3)"),
    (["--stall-target", "2"], "--stall-target must be a fraction"),
    (["--window", "0"], "--window 0: above 0 seconds"),
    (["--cores", "0"], "--cores 0: at least 1"),
    (["--discover"], "does not go with --discover"),
    (["--scaler", "kubernetes"], "--scaler kubernetes needs --deployment"),
    (["--scaler", "slurm"], "--scaler slurm needs the job's token"),
    (["--deployment", "ns/offloaders"], "--deployment is for --scaler kubernetes"),
])
def test_bad_autoscaling_options_are_named(args, message, capsys):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KUBERNETES_", "DLOP_OFFLOAD_TOKEN"))}
    with pytest.raises(SystemExit):
        environment(["--offloaders", "auto", *args, "--", "python", "train.py"], env)
    assert message in capsys.readouterr().err


def test_three_ranks_publish_over_tcp_and_the_controller_reads_each_ranks_latest():
    master = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    clients = [torch.distributed.TCPStore("127.0.0.1", master.port, is_master=False, wait_for_workers=False)
               for _ in range(3)]
    assert figures.read(master) == {}  # nobody has published: nothing, and no wait
    latest = {r: _stats(r, 5 + r, 0.1, 0.01 * r, {"10.0.0.1:7000": 5 + r}, busy=0.5) for r in range(3)}
    publishers = [figures.Publisher(clients[r], r, 3, lambda r=r: latest[r], interval=0.02) for r in range(3)]
    try:
        wait_for(lambda: figures.read(master) == latest, 20, "every rank's figures")
        latest[1] = _stats(1, 50, 0.1, 0.0, {"10.0.0.1:7000": 50})
        wait_for(lambda: figures.read(master)[1] == latest[1], 20, "rank 1's newer figures")
    finally:
        for p in publishers:
            p.stop()


def test_malformed_figures_in_the_store_are_named():
    store = torch.distributed.HashStore()
    store.set(figures.WORLD, "1")
    store.set(figures.figures_key(0), "{not json")
    with pytest.raises(ValueError, match="rank 0's figures under dlop/autoscale/figures/0 .* are malformed"):
        figures.read(store)
    store.set(figures.figures_key(0), '{"rank": 0}')
    with pytest.raises(ValueError, match="are malformed .*missing"):
        figures.read(store)
