"""dlop.fleet.discovery on a real TCPStore (announce order, no duplicates,
withdrawal, a hole left by a dead announcer, a Watcher reporting a late joiner
once), and `dlop offloader --store` end to end: a real dlop-offloader started,
announced, used by an OffloadLoader through the address found in the store,
withdrawn when it stops."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from processes import offloader, wait_for

dist = pytest.importorskip("torch.distributed")

from dlop.fleet import discovery  # noqa: E402

TOKEN = "discovery-test-token-0123456789abcdef"


@pytest.fixture()
def store():
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=10))
    yield master


def client(master):
    return dist.TCPStore("127.0.0.1", master.port, is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=10))


def test_discover_lists_announcements_in_join_order_once(store):
    a, b = client(store), client(store)
    assert discovery.discover(store) == []
    ia = discovery.announce(a, "10.0.0.1:7001")
    ib = discovery.announce(b, "10.0.0.2:7001")
    discovery.announce(a, "10.0.0.1:7001")  # announced twice: listed once
    discovery.announce(b, "10.0.0.3:7002")
    assert (ia, ib) == (1, 2)
    assert discovery.discover(client(store)) == ["10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.3:7002"]
    discovery.withdraw(a, ib)
    assert discovery.discover(store) == ["10.0.0.1:7001", "10.0.0.3:7002"]
    # The raw keys, as documented: a counter and one entry per announcement.
    assert store.add(discovery.COUNT, 0) == 4
    assert store.get("dlop/offloaders/1") == b"10.0.0.1:7001" and store.get("dlop/offloaders/2") == b""


def test_announce_rejects_an_address_without_a_port(store):
    with pytest.raises(ValueError, match="not host:port"):
        discovery.announce(store, "10.0.0.1")
    assert store.add(discovery.COUNT, 0) == 0  # nothing was counted


def test_raw_store_unwraps_prefix_stores(store):
    wrapped = dist.PrefixStore("default_pg", dist.PrefixStore("/worker/attempt_0", store))
    discovery.announce(discovery.raw_store(wrapped), "10.0.0.9:1")
    assert discovery.discover(store) == ["10.0.0.9:1"]


def test_watcher_reports_existing_then_late_joiners_once_each(store):
    discovery.announce(store, "10.0.0.1:1")
    got: list[str] = []
    changed = threading.Condition()

    def callback(address: str) -> None:
        with changed:
            got.append(address)
            changed.notify_all()
        if address == "10.0.0.2:2":
            raise RuntimeError("a failing callback is logged, not raised")

    def wait_for_reports(n: int) -> None:
        with changed:
            assert changed.wait_for(lambda: len(got) >= n, timeout=10), got

    with discovery.Watcher(client(store), callback, interval=0.05) as w:
        wait_for_reports(1)
        discovery.announce(client(store), "10.0.0.2:2")
        wait_for_reports(2)
        # An announcer that died between taking its index and setting its entry
        # leaves a hole: later joiners are still reported, in order.
        store.add(discovery.COUNT, 1)
        discovery.announce(client(store), "10.0.0.1:1")  # a duplicate: not reported again
        discovery.announce(client(store), "10.0.0.3:3")
        wait_for_reports(3)
        store.set("dlop/offloaders/3", "10.0.0.4:4")  # the hole filled late: reported
        wait_for_reports(4)
        time.sleep(0.3)  # more polls: nothing new
        start = time.monotonic()
    assert time.monotonic() - start < 2  # stop() is prompt
    assert got == ["10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3", "10.0.0.4:4"]
    assert not w._thread.is_alive()


def test_watcher_survives_the_store_going_away(caplog):
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=2))
    watched = client(master)
    w = discovery.Watcher(watched, lambda a: None, interval=0.05)
    del master  # the server stops: every poll now fails
    time.sleep(0.5)
    assert w._thread.is_alive()
    w.stop()
    assert "reading the store failed" in caplog.text


# --------------------------------------------------------- dlop offloader --store


def _dlop() -> list[str]:
    return [sys.executable, "-m", "dlop.cli"]


@pytest.fixture()
def token_file(tmp_path):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


def test_dlop_offloader_announces_a_working_daemon_and_withdraws_it(store, token_file, tmp_path):
    offloader()  # or a skip
    torch = pytest.importorskip("torch")
    from dlop.data import OffloadLoader
    from dlop.data.make_dataset import main as make_dataset

    data = tmp_path / "data"
    assert make_dataset([str(data), "--classes", "2", "--per-class", "3", "--seed", "5"]) == 0
    proc = subprocess.Popen(_dlop() + ["offloader", "--store", f"127.0.0.1:{store.port}", "--listen", "127.0.0.1:0",
                                       "--token-file", str(token_file), "--threads", "1"],
                            stdout=subprocess.PIPE, text=True)
    try:
        addresses = wait_for(lambda: discovery.discover(store), 30, "the announcement")
        assert len(addresses) == 1 and addresses[0].startswith("127.0.0.1:")
        assert "listening on " + addresses[0] in proc.stdout.readline()  # the daemon's own line, relayed
        assert f"announced {addresses[0]}" in proc.stdout.readline()
        spec = {"ops": [{"op": "center_crop", "size": 8}], "output": "uint8"}
        loader = OffloadLoader(str(data), spec, 4, shuffle=False, offloaders=addresses, token=TOKEN)
        assert loader.offloaded
        batches = [(x.clone(), y.clone()) for x, y in loader]
        assert [len(y) for _, y in batches] == [4, 2]
        assert torch.cat([y for _, y in batches]).tolist() == [0, 0, 0, 1, 1, 1]
        del loader
        proc.send_signal(signal.SIGTERM)  # forwarded to the daemon, which stops cleanly
        assert proc.wait(timeout=20) == 0
        assert discovery.discover(store) == []  # withdrawn
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dlop_offloader_reports_a_daemon_that_cannot_start(store, tmp_path):
    offloader()  # or a skip
    loose = tmp_path / "token"
    loose.write_text(TOKEN)
    loose.chmod(0o644)  # the daemon refuses a token file others can read
    done = subprocess.run(_dlop() + ["offloader", "--store", f"127.0.0.1:{store.port}", "--token-file", str(loose)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "chmod 600" in done.stderr and "exited with status 1 before listening" in done.stderr
    assert discovery.discover(store) == []


def test_dlop_offloader_names_an_unreachable_store(token_file):
    offloader()  # or a skip
    done = subprocess.run(_dlop() + ["offloader", "--store", "127.0.0.1:1", "--store-timeout", "1",
                                     "--listen", "127.0.0.1:0", "--token-file", str(token_file)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "cannot reach the store at 127.0.0.1:1" in done.stderr
