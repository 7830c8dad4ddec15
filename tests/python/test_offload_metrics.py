"""OffloadLoader.stats() and the DLOP_METRICS_PORT endpoint, over real dlop-offloader daemons:
the stall and step a training loop sees, each offloader's batches and the busy fraction its
batches carry, the Prometheus text a scrape gets (and that it moves as batches are taken), a taken
port that warns and trains on."""

from __future__ import annotations

import gc
import json
import math
import re
import socket
import time
import urllib.error
import urllib.request
import warnings

import pytest

torch = pytest.importorskip("torch")
offload = pytest.importorskip("dlop._C").offload
if not hasattr(offload, "LeaseManager"):
    pytest.skip("dlop._C was built without the lease manager; rebuild it", allow_module_level=True)

from dlop.data import OffloadLoader, metrics  # noqa: E402

TOKEN = "offload-metrics-test-token-0123456789"
SPEC = {"ops": [{"op": "random_resized_crop", "size": 32}, {"op": "hflip", "p": 0.5}]}
BATCH = 4  # 18 samples: 5 batches an epoch


@pytest.fixture()
def endpoint(monkeypatch):
    """A clean slate: no endpoint up, no loader of an earlier test registered; stopped after."""
    gc.collect()
    metrics.stop_server()
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    yield monkeypatch
    metrics.stop_server()


def make_loader(dataset, daemons, **kw) -> OffloadLoader:
    return OffloadLoader(dataset, SPEC, BATCH, shuffle=True, seed=5, offloaders=[d.address for d in daemons],
                         token=TOKEN, prefetch=3, **kw)


def train(loader, step: float = 0.0) -> int:
    """One epoch with `step` seconds of work per batch; the batches taken."""
    n = 0
    for x, _ in loader:
        assert x.shape[0] > 0
        if step:
            time.sleep(step)
        n += 1
    return n


def test_stats_give_the_stall_the_step_and_each_offloader(dataset, daemons, endpoint):
    loader = make_loader(dataset, daemons)
    s = loader.stats()
    assert (s.steps, s.stall_seconds_total, s.batches_in_flight, s.offloaders_live) == (0, 0.0, None, 2)
    assert [o.address for o in s.offloaders] == [d.address for d in daemons]
    assert all(o.busy_fraction is None for o in s.offloaders)  # no batch has said it yet
    started = time.perf_counter()
    assert train(loader, step=0.03) == 5
    took = time.perf_counter() - started
    s = loader.stats()
    assert s.offloaded and s.rank == 0 and s.prefetch == 3 and s.steps == 5
    # The steps cover the loop (4 x 30 ms of work between batches, plus every wait) and no more.
    assert 4 * 0.03 <= s.step_seconds_total <= took
    assert 0 < s.stall_seconds_total < s.step_seconds_total
    assert s.last_step_seconds >= 0.03 and 0 <= s.last_stall_seconds < s.last_step_seconds
    assert s.window_steps == 4 and 0 < s.window_seconds <= metrics.WINDOW_SECONDS
    assert s.stall_ratio == pytest.approx(s.stall_seconds / s.step_seconds)
    assert 0 <= s.batches_in_flight <= 3
    assert s.leases_issued >= 5 and s.leases_reissued == 0
    assert sum(o.batches for o in s.offloaders) == 5  # every batch once, from one of the two
    rate = sum(o.batches_per_second for o in s.offloaders)
    assert 0 < rate <= 5 / s.window_seconds + 1e-9
    # Each daemon's latest batch said how busy it was: a share of its time, above 0 once it made one.
    for o in s.offloaders:
        assert isinstance(o.busy_fraction, float) and 0.0 <= o.busy_fraction <= 1.0, o
        assert o.busy_fraction > 0.0 or o.batches == 0, o
    # A second epoch adds to the totals; stats() from another thread reads the same figures.
    assert train(loader) == 5
    import threading

    seen = []
    t = threading.Thread(target=lambda: seen.append(loader.stats()))
    t.start()
    t.join()
    assert seen[0].steps == 10 and seen[0].stall_seconds_total > s.stall_seconds_total
    assert sum(o.batches for o in seen[0].offloaders) == 10


def test_a_dead_offloader_shows_in_the_stats(dataset, daemons, endpoint):
    loader = make_loader(dataset, daemons, lease_timeout=10.0)
    for k, _ in enumerate(loader):
        if k == 1:
            daemons[0].kill()
    dead, live = (daemons[0].address, daemons[1].address)
    first = {o.address: o.batches for o in loader.stats().offloaders}
    assert train(loader) == 5
    s = loader.stats()
    assert s.steps == 10 and s.offloaders_live == 1
    by = {o.address: o.batches for o in s.offloaders}
    assert by[dead] == first[dead] and by[live] == first[live] + 5  # the next epoch is the live one's
    busy = {o.address: o.busy_fraction for o in s.offloaders}
    assert busy[dead] is None and 0.0 < busy[live] <= 1.0  # a dead daemon's load is unknown


def test_local_batches_have_stats_too(dataset, endpoint):
    with pytest.warns(RuntimeWarning, match="no dlop-offloader answered"):
        loader = OffloadLoader(dataset, SPEC, BATCH, seed=5, offloaders=["127.0.0.1:1"], token=TOKEN, fallback="warn",
                               workers=1, connect_timeout=1.0)
    assert train(loader) == 5
    s = loader.stats()
    assert not s.offloaded and s.steps == 5 and s.offloaders == () and s.offloaders_live == 0
    assert s.batches_in_flight is not None and s.stall_seconds_total > 0


def test_an_offloader_given_twice_counts_once_with_the_larger_busy_fraction(dataset, daemons):
    """Two connections to one daemon: one entry, batches summed, the larger busy fraction known."""
    d = daemons[0]
    manager = offload.LeaseManager(dataset, json.dumps(SPEC), 5, BATCH, TOKEN, prefetch=4, per_daemon=2)
    recorder = metrics.Recorder(prefetch=4)
    for _ in range(2):
        manager.add_daemon("127.0.0.1", int(d.address.rsplit(":", 1)[1]))
        recorder.add_address(d.address)
    assert [o.busy_fraction for o in recorder.stats().offloaders] == [None]
    manager.set_epoch(0)
    recorder.start_iteration(manager)
    while (batch := manager.next()) is not None:
        recorder.offloaded(manager)
        manager.release(batch[3])
    recorder.read(manager)
    known = [b for b in manager.busy_per_daemon() if not math.isnan(b)]
    assert known and all(0 < b <= 1 for b in known)
    (only,) = recorder.stats().offloaders
    assert only.address == d.address and only.batches == 5 and only.busy_fraction == max(known)


# --- the endpoint ---------------------------------------------------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\} (\S+)$')


def parse(text: str) -> dict:
    """Prometheus text exposition, strictly: {name: {"type", "help", "samples": {labels: value}}}."""
    families: dict = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            _, kind, name, rest = line.split(" ", 3)
            families.setdefault(name, {"samples": {}})[kind.lower()] = rest
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.groups()
        assert name in families, f"{name} has no # HELP / # TYPE before it"
        labels = tuple(sorted(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels)))
        assert labels not in families[name]["samples"], f"{name}{labels} twice"
        families[name]["samples"][labels] = float(value)
    for name, f in families.items():
        assert f.get("type") in {"counter", "gauge"} and f.get("help"), name
    return families


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def test_the_endpoint_serves_prometheus_text_that_moves(dataset, daemons, endpoint):
    endpoint.setenv("DLOP_METRICS_PORT", "0")  # any free port
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = make_loader(dataset, daemons)
    port = loader.metrics_port
    assert port and port == metrics.server_port()
    mine = tuple(sorted(loader.metrics_labels.items()))
    assert dict(mine)["rank"] == "0"

    def value(families, name, **extra):
        return families[name]["samples"][tuple(sorted(mine + tuple(extra.items())))]

    before = parse(scrape(port))
    assert value(before, "dlop_data_batches_total") == 0
    assert before["dlop_data_stall_seconds_total"]["type"] == "counter"
    assert before["dlop_data_offloader_batches_per_second"]["type"] == "gauge"
    assert "dlop_data_offloader_busy_ratio" in before and not before["dlop_data_offloader_busy_ratio"]["samples"]
    assert train(loader, step=0.01) == 5
    after = parse(scrape(port))
    assert value(after, "dlop_data_batches_total") == 5
    assert value(after, "dlop_data_stall_seconds_total") > value(before, "dlop_data_stall_seconds_total")
    assert value(after, "dlop_data_step_seconds_total") >= 4 * 0.01
    assert 0 <= value(after, "dlop_data_stall_ratio") <= 1
    assert value(after, "dlop_data_offloaders_live") == 2 and value(after, "dlop_data_offloaded") == 1
    per = [value(after, "dlop_data_offloader_batches_sent_total", offloader=d.address) for d in daemons]
    assert sum(per) == 5
    rates = [value(after, "dlop_data_offloader_batches_per_second", offloader=d.address) for d in daemons]
    assert all(r >= 0 for r in rates) and sum(rates) > 0 and all(math.isfinite(r) for r in rates)
    # Each daemon that made a batch said how busy it was: one sample each, as stats() has it.
    stats = {o.address: o for o in loader.stats().offloaders}
    busy = after["dlop_data_offloader_busy_ratio"]["samples"]
    assert len(busy) == sum(1 for n in per if n > 0)
    for d, n in zip(daemons, per):
        if n > 0:
            assert 0 < value(after, "dlop_data_offloader_busy_ratio", offloader=d.address) <= 1
            assert value(after, "dlop_data_offloader_busy_ratio", offloader=d.address) == stats[d.address].busy_fraction
    # A second loader joins the same endpoint under its own labels; other paths are not served.
    other = make_loader(dataset, daemons[:1])
    assert other.metrics_port == port and other.metrics_labels != loader.metrics_labels
    both = parse(scrape(port))
    assert len(both["dlop_data_batches_total"]["samples"]) == 2
    with pytest.raises(urllib.error.HTTPError, match="404"):
        scrape(port, "/")


def test_a_taken_port_warns_naming_it_and_training_goes_on(dataset, daemons, endpoint):
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        # Several ranks on a host: rank k serves DLOP_METRICS_PORT + LOCAL_RANK.
        endpoint.setenv("DLOP_METRICS_PORT", str(port - 1))
        endpoint.setenv("LOCAL_RANK", "1")
        with pytest.warns(RuntimeWarning, match=rf"port {port} \(DLOP_METRICS_PORT={port - 1} \+ LOCAL_RANK 1\)"):
            loader = make_loader(dataset, daemons)
        assert loader.metrics_port is None and loader.offloaded
        assert train(loader) == 5 and loader.stats().steps == 5
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once
            make_loader(dataset, daemons)
    finally:
        taken.close()
    endpoint.setenv("DLOP_METRICS_PORT", "not-a-port")
    with pytest.warns(RuntimeWarning, match="DLOP_METRICS_PORT=not-a-port is not a port"):
        loader = make_loader(dataset, daemons)
    assert train(loader) == 5


def test_the_text_escapes_labels_and_leaves_out_unknown_values():
    s = metrics.LoaderStats(
        rank=0, offloaded=True, time=1.0, steps=3, stall_seconds_total=0.5, step_seconds_total=2.0,
        last_stall_seconds=0.1, last_step_seconds=0.7, window_seconds=1.4, window_steps=2,
        stall_seconds=0.2, step_seconds=0.7, stall_ratio=0.25, batches_in_flight=None, prefetch=4,
        offloaders_live=1, leases_issued=3, leases_reissued=0,
        offloaders=(metrics.OffloaderStats('h"\\\n:1', 3, 2.5, 0.75), metrics.OffloaderStats("g:2", 0, 0.0)))
    text = metrics.exposition([({"rank": "0", "loader": "7"}, s)])
    families = parse(text)
    assert "dlop_data_batches_in_flight" in families and not families["dlop_data_batches_in_flight"]["samples"]
    assert families["dlop_data_stall_ratio"]["samples"][(("loader", "7"), ("rank", "0"))] == 0.25
    busy = families["dlop_data_offloader_busy_ratio"]["samples"]
    assert busy == {(("loader", "7"), ("offloader", 'h\\"\\\\\\n:1'), ("rank", "0")): 0.75}
    assert 'offloader="h\\"\\\\\\n:1"' in text
