"""`dlop run --offloaders-dns NAME:PORT`: every address behind a name (dlop.fleet.dns).

Names are resolved by the system's resolver. The reference is glibc's own
answer through another program (`getent ahosts`). For a name with several
records, as a Kubernetes headless Service has, the trainer runs in a private
mount namespace whose /etc/hosts gives one name three addresses: two with a
real dlop-offloader behind them (on the same port, as pods of one Service
are) and one with nothing, which must cost nothing. Both daemons must serve
the training, and its epochs must be dlop's plan, each sample once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dlop.fleet import dns

BIN = Path(sys.executable).parent


def _getent(name: str) -> list[str]:
    out = subprocess.run(["getent", "ahosts", name], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        address = line.split()[0]
        if address not in found:
            found.append(address)
    return found


@pytest.mark.parametrize("name", ["localhost", socket.gethostname()])
def test_a_name_resolves_to_every_address_the_system_resolver_gives(name):
    want = _getent(name)
    assert want, f"{name} does not resolve here"
    got = dns.resolve(f"{name}:7001")
    assert got == [dns.join_host_port(a, 7001) for a in want]


@pytest.mark.parametrize("text, want", [
    ("10.1.2.3:5", ["10.1.2.3:5"]),
    ("[::1]:7001", ["[::1]:7001"]),
    ("127.0.0.1:65535", ["127.0.0.1:65535"]),
])
def test_literal_addresses_resolve_to_themselves(text, want):
    assert dns.resolve(text) == want


@pytest.mark.parametrize("text, message", [
    ("offloaders", "is not NAME:PORT"),
    ("offloaders:", "is not NAME:PORT"),
    (":7001", "is not NAME:PORT"),
    ("offloaders:0", "is not NAME:PORT"),
    ("offloaders:65536", "is not NAME:PORT"),
    ("::1:7001", "an IPv6 address goes in brackets"),
])
def test_malformed_names_are_refused_naming_them(text, message):
    with pytest.raises(ValueError, match=message):
        dns.resolve(text)


def test_a_name_that_does_not_resolve_is_named():
    with pytest.raises(OSError, match="no-such-host.invalid does not resolve"):
        dns.resolve("no-such-host.invalid:7001")


def test_waiting_names_every_address_tried_and_every_name_that_failed():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    candidates = dns.Candidates([dead], ["no-such-host.invalid:1"])
    ready, why = dns.wait_for_any(candidates, 0)
    assert ready == []
    assert why.startswith("no offloader answered: ") and dead in why and "no-such-host.invalid does not resolve" in why


def test_waiting_returns_once_an_offloader_starts_listening():
    with socket.socket() as late:
        late.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{late.getsockname()[1]}"
        threading.Timer(0.3, late.listen).start()
        ready, why = dns.wait_for_any(dns.Candidates([address], []), 60)
    assert ready == [address] and why == ""


def test_waiting_for_nothing_returns_at_once():
    assert dns.wait_for_any(dns.Candidates([], []), 3600) == ([], "no offloader address or name was given")


def test_the_watcher_reports_an_address_once_when_it_starts_answering():
    with socket.socket() as late:
        late.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{late.getsockname()[1]}"
        with socket.socket() as early:
            early.bind(("127.0.0.1", 0))
            early.listen()
            known = f"127.0.0.1:{early.getsockname()[1]}"
            reported, event = [], threading.Event()

            def callback(a):
                reported.append(a)
                event.set()

            watcher = dns.Watcher(dns.Candidates([known, address], []), callback, seen=[known], interval=0.05)
            try:
                assert not event.wait(0.3)  # nothing listens at `address` yet; `known` was seen already
                late.listen()
                assert event.wait(10)
                watcher._thread.join(5)  # fixed addresses, all seen: the thread ends by itself
                assert not watcher._thread.is_alive()
            finally:
                watcher.stop()
    assert reported == [address]


# ------------------------------------------------ dlop run --offloaders-dns, end to end

NAME = "offloaders.test"


def _needs_root_and_daemon() -> str:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private /etc/hosts needs root and unshare (a mount namespace)")
    exe = BIN / "dlop-offloader"
    if not os.access(exe, os.X_OK):
        pytest.skip("dlop-offloader is not built (make build)")
    return str(exe)


def _in_private_hosts(hosts: Path, argv: list[str]) -> list[str]:
    """argv in a mount namespace where /etc/hosts is `hosts` (this machine's stays as it is)."""
    return ["unshare", "--mount", "sh", "-c", f'mount --bind "{hosts}" /etc/hosts && exec "$@"', "sh", *argv]


def _free_port_on_both() -> int:
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.2", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.3", port))
            except OSError:
                continue
            return port
    raise AssertionError("no port free on both 127.0.0.2 and 127.0.0.3")


def test_dlop_run_uses_every_offloader_behind_a_name(tmp_path):
    exe = _needs_root_and_daemon()
    import test_dlop_run as run_test  # its script, dataset and plan helpers

    torch = pytest.importorskip("torch")  # noqa: F841
    offload = pytest.importorskip("dlop._C").offload
    media = pytest.importorskip("dlop._C").media
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n127.0.0.2 {NAME}\n127.0.0.3 {NAME}\n::1 {NAME}\n")
    resolved = subprocess.run(_in_private_hosts(hosts, [sys.executable, "-c", "import sys; from dlop.fleet import dns; "
                                                        f"print(','.join(dns.resolve('{NAME}:' + sys.argv[1])))",
                                                        "7001"]), capture_output=True, text=True, timeout=60)
    assert sorted(resolved.stdout.strip().split(",")) == ["127.0.0.2:7001", "127.0.0.3:7001", "[::1]:7001"], \
        resolved.stderr  # every record, in the resolver's preference order

    data, script = tmp_path / "images", tmp_path / "train.py"
    from dlop.cli import main as dlop_main

    assert dlop_main(["make-dataset", str(data), "--classes", "3", "--per-class", "4", "--seed", "2"]) == 0
    script.write_text(run_test.SCRIPT)
    token = tmp_path / "token"
    token.write_text(run_test.TOKEN + "\n")
    token.chmod(0o600)
    port = _free_port_on_both()
    daemons, logs = [], []
    try:
        for host in ("127.0.0.2", "127.0.0.3"):
            logs.append(tmp_path / f"{host}.log")
            daemons.append(subprocess.Popen([exe, "--listen", f"{host}:{port}", "--token-file", str(token),
                                             "--threads", "1"], stdout=subprocess.PIPE, stderr=logs[-1].open("w"),
                                            text=True, env={**os.environ, "DLOP_LOG_LEVEL": "info"}))
            assert "listening on" in daemons[-1].stdout.readline()
        done = subprocess.run(_in_private_hosts(hosts, [str(BIN / "dlop"), "run", "--offloaders-dns", f"{NAME}:{port}",
                                                        "--token-file", str(token), "--", "python", str(script),
                                                        str(data)]),
                              capture_output=True, text=True, timeout=180, env=run_test._env())
        assert done.returncode == 0, done.stderr
    finally:
        for d in daemons:
            d.kill()
            d.wait()
    assert "dlop run: 6 batches made by dlop-offloader, 0 made locally" in done.stderr, done.stderr
    assert "not offloaded" not in done.stderr
    for log in logs:  # both addresses behind the name served the job
        assert f"configured: {data}" in log.read_text()
    (r,) = run_test.results(done.stdout)
    source = media.open_source(str(data))
    images, labels, _ = media.ImagePipeline(json.dumps(run_test.SPEC)).run_batch(source, list(range(len(source))),
                                                                           seed=0, epoch=0)
    keys = [[int(labels[i]), hashlib.sha1(images[i].tobytes()).hexdigest()[:16]] for i in range(len(source))]
    for epoch, got in enumerate(r["epochs"]):
        plan = offload.EpochPlan(len(keys), 4, 0, True, False, 0, 1).batches(epoch)
        assert got == [[keys[i] for i in batch] for batch in plan]


def test_dlop_run_refuses_a_malformed_name():
    done = subprocess.run([str(BIN / "dlop"), "run", "--offloaders-dns", "offloaders", "--token-file", "t", "--",
                           "true"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--offloaders-dns 'offloaders' is not NAME:PORT" in done.stderr
