"""dlop.bench.linearity's report, fed the measurements of a real run on this project's machine.

The recorded run is the committed bench/results/linearity/2026-11-24-d01244b/ (made by
`python -m dlop.bench.linearity --ranks 1,2,4`, dlop and Gloo; its raw/ holds
each dlop.bench.ddp run's own JSON): the report stage is run again from it with
`dlop report linearity --from-json`, so these tests take seconds; the
measuring side (dlop.bench.ddp) has its own smoke test in test_bench_smoke.py.
The markdown and the JSON must say the same; linearity and dlop's speed-up are
recomputed here from the raw throughputs; the PNGs must be real images of the
documented size; the scaling model must be checked against every measured N;
oversubscription (ranks x threads > cores) must be flagged, which is also
checked by reporting the same measurements as if the machine had one core.
"""

from __future__ import annotations

import json
import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from dlop.bench import scaling_model as sm
from dlop.bench.linearity_report import PLOT_DPI, PLOT_INCHES, PLOTS

DLOP = Path(sys.executable).with_name("dlop")
RECORDED = Path(__file__).resolve().parents[2] / "bench" / "results" / "linearity" / "2026-11-24-d01244b"


def _run(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _report_again(recorded_json: Path, out: Path) -> Path:
    _run([str(DLOP), "report", "linearity", "--from-json", str(recorded_json), "--out", str(out)])
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return _report_again(RECORDED / "linearity.json", tmp_path_factory.mktemp("linearity"))


def _report(folder: Path) -> tuple[dict, str]:
    return json.loads((folder / "linearity.json").read_text()), (folder / "linearity.md").read_text()


def _table(markdown: str, section: str) -> list[dict]:
    """The first table after the heading `section`, as dicts keyed by its header cells."""
    lines = markdown[markdown.index(section):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(head, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def _backend_cell(row: dict) -> str:
    return "model alone" if row["backend"] == "none" else row["backend"]


def test_markdown_and_json_agree(run_dir):
    data, text = _report(run_dir)
    table = _table(text, "## Measured")
    models, ranks = {r["model"] for r in data["measured"]}, {r["ranks"] for r in data["measured"]}
    assert len(table) == len(data["measured"]) == len(models) * (1 + 2 * len(ranks))  # model alone; dlop, gloo
    for row, cells in zip(data["measured"], table):
        assert cells["model"] == row["model"] and cells["backend"] == _backend_cell(row)
        assert int(cells["N"]) == row["ranks"]
        assert float(cells["samples/s"]) == pytest.approx(row["samples_per_s"], abs=0.051)
        assert float(cells["ideal samples/s"]) == pytest.approx(row["ideal_samples_per_s"], abs=0.051)
        assert float(cells["linearity"]) == pytest.approx(row["linearity"], abs=5.1e-4)
        speedup = row["speedup"].get("gloo")
        assert cells["dlop/gloo"] == ("-" if speedup is None else f"{speedup:.2f}")


def test_linearity_and_speedup_recomputed_from_throughputs(run_dir):
    data, _ = _report(run_dir)
    rows = {(r["model"], r["backend"], r["ranks"]): r for r in data["measured"]}
    for model in {r["model"] for r in data["measured"]}:
        raw = json.loads((RECORDED / "raw" / "ddp_1.json").read_text())["rows"]
        alone = next(r["samples_per_s"] for r in raw if r["backend"] == "none" and r["model"] == model)
        assert alone == next(r["samples_per_s"] for r in data["measured"] if r["model"] == model and r["ranks"] == 1
                             and r["backend"] == "none")
    for row in data["measured"]:
        backend, n = row["backend"], row["ranks"]
        one = next(r["samples_per_s"] for r in data["measured"]
                   if r["model"] == row["model"] and r["ranks"] == 1 and r["backend"] == "none")
        assert row["samples_per_s"] > 0 and row["params_in_sync"]
        assert row["linearity"] == pytest.approx(row["samples_per_s"] / (n * one), rel=1e-12)
        assert row["ideal_samples_per_s"] == pytest.approx(n * one, rel=1e-12)
        if backend == "dlop":
            gloo = rows[(row["model"], "gloo", n)]["samples_per_s"]
            assert row["speedup"]["gloo"] == pytest.approx(row["samples_per_s"] / gloo)
        else:
            assert row["speedup"] == {}


def test_run_is_labelled(run_dir):
    data, text = _report(run_dir)
    h = data["header"]
    assert h["cpu"] and h["cores"] >= 1 and h["revision"] and h["torch"]
    for value in (h["cpu"], f"{h['cores']} cores", h["revision"], h["torch"]):
        assert value in text


def test_pngs_are_images_of_the_documented_size(run_dir):
    import matplotlib.image

    width, height = (round(inches * PLOT_DPI) for inches in PLOT_INCHES)
    for name in PLOTS:
        raw = (run_dir / name).read_bytes()
        assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR", name
        assert struct.unpack(">II", raw[16:24]) == (width, height), name
        pixels = matplotlib.image.imread(run_dir / name)
        assert pixels.shape[:2] == (height, width)
        assert pixels.std() > 0.01, f"{name} is blank"


def test_model_is_checked_at_every_measured_n(run_dir):
    data, text = _report(run_dir)
    measured = {(r["model"], r["backend"], r["ranks"]): r for r in data["measured"]
                if r["backend"] != "none" and r["ranks"] > 1}
    checks = {(c["model"], c["backend"], c["ranks"]): c for c in data["checks"]}
    assert set(checks) == set(measured)
    table = {(c["model"], c["backend"], int(c["N"])): c for c in _table(text, "## Scaling model: checked")}
    for key, check in checks.items():
        assert check["measured_linearity"] == measured[key]["linearity"]
        assert check["error"] == pytest.approx(check["predicted_linearity"] - check["measured_linearity"])
        assert 0 < check["predicted_linearity"] <= 1
        assert float(table[key]["predicted linearity"]) == pytest.approx(check["predicted_linearity"], abs=5.1e-4)
        assert float(table[key]["measured linearity"]) == pytest.approx(check["measured_linearity"], abs=5.1e-4)
    predicted = _table(text, "## Scaling model: predictions")
    assert len(predicted) == len(data["predicted"]) == len({c[0] for c in checks}) * len(sm.ALGORITHMS) * 3  # 3 links
    for cells, p in zip(predicted, data["predicted"]):
        assert float(cells["N = 1024"]) == pytest.approx(p["linearity"]["1024"], abs=5.1e-4)


def test_oversubscription_is_flagged(run_dir, tmp_path):
    data, text = _report(run_dir)
    cores = data["header"]["cores"]
    over = sorted({r["ranks"] for r in data["measured"] if r["ranks"] * r["threads_per_rank"] > cores})
    for row in data["measured"]:
        assert row["oversubscribed"] == (row["ranks"] in over)
    if over:
        assert f"**Oversubscribed: N = {', '.join(map(str, over))}.**" in text
    data["header"]["cores"] = 1  # the same measurements, reported as if this were a 1-core machine
    recorded = tmp_path / "recorded.json"
    recorded.write_text(json.dumps(data))
    from dlop.bench import linearity

    assert linearity.main(["--from-json", str(recorded), "--out", str(tmp_path / "again")]) == 0
    data, text = _report(tmp_path / "again")
    above_one = sorted({r["ranks"] for r in data["measured"] if r["ranks"] > 1})
    assert f"**Oversubscribed: N = {', '.join(map(str, above_one))}.**" in text
    for row, cells in zip(data["measured"], _table(text, "## Measured")):
        assert row["oversubscribed"] == (row["ranks"] > 1)
        assert cells["oversubscribed"] == ("**yes**" if row["ranks"] > 1 else "no")
    assert all(c["oversubscription"] == c["ranks"] for c in data["checks"])


def test_scaling_model_formulas():
    link, fast = sm.Link(10, 5), sm.Link(400, 1)
    nbytes = 100e6
    assert sm.ring_allreduce(nbytes, 4, link) == pytest.approx(6 * 5e-6 + 1.5 * nbytes * 8 / 10e9)
    assert sm.ring_allreduce(nbytes, 1, link) == 0
    # 16 ranks, 8 per host: intra reduce and broadcast (7 hops, 7/8 of the bytes each) + a 2-leader ring.
    expected = 2 * (7 * 1e-6 + 7 / 8 * nbytes * 8 / 400e9) + (2 * 5e-6 + nbytes * 8 / 10e9)
    assert sm.hierarchical_allreduce(nbytes, 16, 8, fast, link) == pytest.approx(expected)
    # A flat ring spanning hosts runs at the network link's speed.
    assert sm.allreduce_seconds("flat ring", nbytes, 16, 8, fast, link) == pytest.approx(sm.ring_allreduce(nbytes, 16, link))
    # Communication hidden behind backward costs nothing but the last bucket.
    compute = 1.0
    step = sm.step_seconds(compute, nbytes, 25 * 2**20, "flat ring", 4, 4, fast, fast)
    last = nbytes - 3 * 25 * 2**20
    assert step == pytest.approx(compute + sm.ring_allreduce(last, 4, fast))
    # With nothing to hide behind, the whole bucketed all-reduce adds up.
    step = sm.step_seconds(1e-6, nbytes, 25 * 2**20, "flat ring", 4, 4, link, link)
    whole = 4 * sm.ring_allreduce(nbytes / 4, 4, link)
    assert step == pytest.approx(1e-6 + whole - sm.BACKWARD_SHARE * 1e-6)
    with pytest.raises(ValueError, match="unknown all-reduce algorithm"):
        sm.allreduce_seconds("tree", nbytes, 4, 4, link, link)


def test_fit_recovers_a_known_bandwidth():
    work = [sm.Workload("a", 0.01, 64e6), sm.Workload("b", 0.002, 200e6)]
    truth = sm.Link(12.0, 2.0)
    points = [(w, 2, 1.0, sm.step_seconds(w.compute_s, w.gradient_bytes, 25 * 2**20, "flat ring", 2, 2, truth, truth))
              for w in work]
    fitted = sm.fit_intra_gbps(points, 25 * 2**20, 2.0)
    assert math.isclose(fitted, 12.0, rel_tol=0.04)


def test_hosts_fail_clearly_without_namespaces(tmp_path, capsys):
    from dlop.bench import linearity

    try:
        from dlop.bench import netns
    except ImportError:
        netns = None
    if netns is not None and netns.available()[0]:
        pytest.skip("network namespaces can be made here: --hosts runs for real (a benchmark, not this test)")
    with pytest.raises(SystemExit) as stop:
        linearity.main(["--hosts", "2", "--out", str(tmp_path)])
    assert re.search(r"--hosts.*(netns|network namespaces)", str(stop.value)), stop.value
    assert not (tmp_path / "raw").exists()  # failed before any run


@pytest.mark.parametrize("args, words", [(["--ranks", "0"], "positive"), (["--models", "nope"], "nope"),
                                         (["--backends", "gloo"], "dlop"), (["--link-gbps", "0"], "positive")])
def test_bad_arguments_name_the_problem(tmp_path, capsys, args, words):
    from dlop.bench import linearity

    with pytest.raises(SystemExit) as stop:
        linearity.main(["--out", str(tmp_path), *args])
    assert stop.value.code == 2 and words in capsys.readouterr().err
