"""What a fleet shows of itself, over real dlop-offloader daemons: one metric
naming scheme on the trainer's endpoint (DLOP_METRICS_PORT) and the daemon's
(--metrics-port), linted by promtool; a wrong token counted in the daemon's
/metrics and caught by the documented alert; the bytes read being the files'
sizes; and `dlop run` passing options to its local daemons and printing
their token file."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from processes import Daemon, offloader, token_file_with, wait_for

torch = pytest.importorskip("torch")
offload = pytest.importorskip("dlop._C").offload
if not hasattr(offload, "LeaseManager"):
    pytest.skip("dlop._C was built without the lease manager; rebuild it", allow_module_level=True)

from dlop.data import OffloadLoader, metrics  # noqa: E402
from dlop.errors import Error  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "examples/prometheus/dlop-alerts.yaml"
TOKEN = "offload-observability-test-token-0123456789"
SPEC = {"ops": [{"op": "random_resized_crop", "size": 32}, {"op": "hflip", "p": 0.5}]}
BATCH = 4  # 18 samples: 5 batches an epoch

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')


def parse(text: str) -> dict:
    """{name: {"type", "help", "samples": {labels: value}}} of Prometheus text."""
    families: dict = {}
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            _, kind, name, rest = line.split(" ", 3)
            families.setdefault(name, {"samples": {}})[kind.lower()] = rest
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.groups()
        labels = tuple(sorted(re.findall(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"', labels or "")))
        families[name]["samples"][labels] = float(value)
    return families


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        return r.read().decode()


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; scripts/setup-system.sh)")
    return found


class MetricsDaemon(Daemon):
    """A Daemon with --metrics-port 0; `metrics` is its endpoint's HOST:PORT (its ready line's)."""

    def __init__(self, token_file: Path) -> None:
        self.proc = subprocess.Popen([offloader(), "--listen", "127.0.0.1:0", "--token-file", str(token_file),
                                      "--threads", "1", "--metrics-port", "0"], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.fullmatch(r"dlop-offloader \(metrics on (\S+)\) listening on (\S+)\n", line)
        assert m, f"dlop-offloader did not start: {line!r}"
        self.metrics, self.address = m.groups()
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()


@pytest.fixture()
def token_file(tmp_path) -> Path:
    return token_file_with(tmp_path / "token", TOKEN)


@pytest.fixture()
def daemon(token_file):
    d = MetricsDaemon(token_file)
    yield d
    d.kill()


@pytest.fixture()
def endpoint():
    gc.collect()
    metrics.stop_server()
    yield
    metrics.stop_server()


def settled(d: Daemon) -> dict:
    """The daemon's metrics once its open leases are done (its levels lag its answers by a loop pass)."""
    out = {}

    def idle() -> bool:
        out["f"] = parse(scrape(d.metrics))
        return out["f"]["dlop_offloader_leases_in_progress"]["samples"][()] == 0

    wait_for(idle, 10, "the daemon's leases to close")
    return out["f"]


def test_the_trainer_and_the_daemon_name_their_metrics_by_one_scheme(dataset, daemon, endpoint):
    loader = OffloadLoader(dataset, SPEC, BATCH, seed=5, offloaders=[daemon.address], token=TOKEN, prefetch=3)
    port = metrics.start_server(0, "127.0.0.1")
    assert sum(1 for _ in loader) == 5
    trainer_text = scrape(f"127.0.0.1:{port}")
    daemon_families = settled(daemon)
    daemon_text = scrape(daemon.metrics)
    trainer_families = parse(trainer_text)

    # promtool's lint: base units, _total on counters only, HELP everywhere.
    for text in (trainer_text, daemon_text):
        done = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    for prefix, families in (("dlop_data_", trainer_families), ("dlop_offloader_", daemon_families)):
        for name, f in families.items():
            assert name.startswith(prefix), name
            assert (f["type"] == "counter") == name.endswith("_total"), name
            assert "fraction" not in name, name
            if name.endswith("_ratio"):
                assert all(0 <= v <= 1 for v in f["samples"].values()), (name, f["samples"])

    # What the trainer says of an offloader is named as the daemon names it, and agrees with it.
    seen = {name.removeprefix("dlop_data_offloader_") for name in trainer_families
            if name.startswith("dlop_data_offloader_")}
    assert {"batches_sent_total", "busy_ratio"} <= seen
    for stem in ("batches_sent_total", "busy_ratio"):
        mine, theirs = trainer_families[f"dlop_data_offloader_{stem}"], daemon_families[f"dlop_offloader_{stem}"]
        assert mine["type"] == theirs["type"], stem
    (sent,) = trainer_families["dlop_data_offloader_batches_sent_total"]["samples"].values()
    assert sent == daemon_families["dlop_offloader_batches_sent_total"]["samples"][()] == 5
    # One busy window: the daemon's figure covers the span each batch reports to the trainers.
    window = offload.BUSY_WINDOW_SECONDS
    assert f"last {window:g} s" in daemon_families["dlop_offloader_busy_ratio"]["help"]
    # offloader-stats' counters are all in /metrics too.
    stats = offload.daemon_stats("127.0.0.1", int(daemon.address.rsplit(":", 1)[1]), TOKEN, 10.0)
    names = "\n".join(daemon_families)
    for counter in stats["counters"]:
        stem = {"batches_ready": "batches_sent", "connections": "connections_accepted",
                "open_connections": "connections_open", "open_leases": "leases_in_progress"}.get(counter, counter)
        assert re.search(rf"^dlop_offloader_{stem}(_total)?$", names, re.M), counter
    for stage in stats["stages"]:
        assert (("stage", stage["name"]),) in daemon_families["dlop_offloader_stage_bytes_total"]["samples"]


def test_a_wrong_token_shows_in_the_daemons_metrics_and_fires_the_alert(daemon, tmp_path):
    before = scrape(daemon.metrics)
    assert parse(before)["dlop_offloader_auth_failures_total"]["samples"][()] == 0
    host, port = daemon.address.rsplit(":", 1)
    with pytest.raises(Error, match="token"):
        offload.daemon_stats(host, int(port), "not-the-fleets-token-0123456789abcdef", 10.0)
    after = scrape(daemon.metrics)
    assert parse(after)["dlop_offloader_auth_failures_total"]["samples"][()] == 1

    # The documented alert, over these two scrapes as Prometheus would hold them a minute apart.
    check = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    series: dict[str, list[str]] = {}
    for text in (before, before, after, after, after):
        for line in (x for x in text.splitlines() if not x.startswith("#")):
            name, labels, value = SAMPLE.match(line).groups()
            key = f'{name}{{{(labels + ",") if labels else ""}instance="offloader-0"}}'
            series.setdefault(key, []).append(value)
    (rule,) = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    tests = {"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": k, "values": " ".join(v)} for k, v in series.items()],
        "alert_rule_test": [
            {"eval_time": "1m", "alertname": rule["alert"], "exp_alerts": []},
            {"eval_time": "3m", "alertname": rule["alert"], "exp_alerts": [{
                "exp_labels": {"severity": "critical", "instance": "offloader-0"},
                "exp_annotations": {"summary": "offloader-0 refuses connections: a wrong or missing token"}}]},
        ]}]}
    (tmp_path / "alert-test.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([promtool(), "test", "rules", "alert-test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # The docs show the same rule.
    assert rule["expr"] in (ROOT / "docs/offload.md").read_text()


def test_bytes_read_are_the_files_sizes_and_offloader_stats_shows_the_rate(dataset, daemon, token_file):
    files = sum(p.stat().st_size for p in Path(dataset).rglob("*") if p.is_file())
    loader = OffloadLoader(dataset, SPEC, BATCH, seed=5, offloaders=[daemon.address], token=TOKEN, prefetch=3)
    assert sum(1 for _ in loader) == 5
    settled(daemon)
    dlop = Path(sys.executable).parent / "dlop"
    done = subprocess.run([str(dlop), "offloader-stats", daemon.address, "--token-file", str(token_file), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    by = {s["name"]: s for s in json.loads(done.stdout)["stages"]}
    assert by["read"]["items"] == 18 and by["read"]["bytes"] == files
    # Decoded: the RGB pixels of each sample's crop region, at least one pixel each.
    assert by["decode"]["bytes"] >= 18 * 3
    table = subprocess.run([str(dlop), "offloader-stats", daemon.address, "--token-file", str(token_file)],
                           capture_output=True, text=True, timeout=60).stdout
    (read_row,) = [line.split() for line in table.splitlines() if line.split()[:1] == ["read"]]
    assert float(read_row[4]) > 0, table  # MB/s
    stage = parse(scrape(daemon.metrics))["dlop_offloader_stage_bytes_total"]["samples"]
    assert stage[(("stage", "read"),)] == files


class RawFiles(torch.utils.data.Dataset):
    """The generic Python path: each sample is one file's bytes, read by the worker."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        with open(self.paths[i], "rb") as f:
            return torch.tensor(len(f.read()))


def test_the_python_path_counts_the_bytes_its_workers_read(dataset, daemon, token_file):
    paths = sorted(str(p) for p in Path(dataset).rglob("*.jpg"))
    files = sum(os.path.getsize(p) for p in paths)
    loader = OffloadLoader(dataset=RawFiles(paths), batch_size=BATCH, seed=5, offloaders=[daemon.address],
                           token=TOKEN)
    assert sum(int(x.sum()) for x in loader) == files
    settled(daemon)
    stats = offload.daemon_stats("127.0.0.1", int(daemon.address.rsplit(":", 1)[1]), TOKEN, 10.0)
    read = {s["name"]: s for s in stats["stages"]}["read"]
    assert read["items"] == len(paths)
    # Every file whole, and little more: the workers' other reads (a module imported late) are few.
    assert files <= read["bytes"] < files + 4 * 1024 * 1024, (read, files)


def test_dlop_run_passes_daemon_options_and_prints_the_token_file(tmp_path):
    gate = tmp_path / "gate"
    script = "import os, time\nwhile not os.path.exists(%r): time.sleep(0.05)\n" % str(gate)
    dlop = Path(sys.executable).parent / "dlop"
    proc = subprocess.Popen([str(dlop), "run", "--local-offloaders", "2", "--offloader-threads", "2",
                             "--offloader-metrics-port", "0", "--offloader-arg=--no-python", "--",
                             sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stderr.readline() for _ in range(3)]
        text = "".join(lines)
        started = re.search(r"started 2 local dlop-offloader daemon\(s\): (.*); they stop", text)
        assert started, text
        daemons = re.findall(r"(127\.0\.0\.1:\d+) \(pid (\d+)\)", started.group(1))
        token_file = Path(re.search(r"their token file: (\S+) ", text).group(1))
        assert token_file.read_text().strip() and token_file.stat().st_mode & 0o077 == 0
        urls = re.findall(r"http://(127\.0\.0\.1:\d+)/metrics", text)
        assert len(urls) == 2 and len(daemons) == 2
        for url in urls:
            assert parse(scrape(url))["dlop_offloader_compute_threads"]["samples"][()] == 2
        for _, pid in daemons:
            assert b"--no-python" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        # The printed token file is the one dlop offloader-stats needs.
        done = subprocess.run([str(dlop), "offloader-stats", daemons[0][0], "--token-file", str(token_file),
                               "--json"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["counters"]["auth_failures"] == 0
    finally:
        gate.touch()
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert not token_file.exists()


@pytest.mark.parametrize("args, message", [
    (["--offloaders", "h:1", "--offloader-threads", "2"], "--offloader-threads is for the daemons dlop run starts"),
    (["--offloader-metrics-port", "65535", "--local-offloaders", "2"], "--offloader-metrics-port 65535"),
    (["--offloader-threads", "0"], "--offloader-threads 0: at least 1"),
])
def test_daemon_options_out_of_place_are_named(args, message, capsys):
    from dlop.fleet.run import environment

    with pytest.raises(SystemExit):
        environment([*args, "--", "python", "x.py"], {"DLOP_OFFLOAD_TOKEN": TOKEN})
    assert message in capsys.readouterr().err
