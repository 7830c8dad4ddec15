"""The Python benchmarks run for 2 ranks at tiny sizes and write well-formed JSON.

Fast smoke tests of bench.c10d (under torchrun), bench.ddp (spawning its
own ranks), bench.device, and dlop report on their JSON files; the figures
themselves are not checked, only that every row is there, has the documented fields, and that every
checked collective gave the expected values (#wrong 0) on dlop and on Gloo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.collectives.c10d_ops import CASES
from bench.ddp.ddp import pinned_cores

pytestmark = pytest.mark.long_file(seconds=100)  # handed out first (conftest.py)
ROOT = Path(__file__).resolve().parents[2]  # where `python -m bench.NAME` finds the benchmark lab

C10D_FIELDS = {"op", "bytes", "dtype", "ranks", "impl", "time_us", "algbw_gbps", "busbw_gbps", "wrong", "cpu_us"}
DDP_FIELDS = {"model", "backend", "ranks", "samples_per_s", "linearity", "cpu_ms_per_step", "cpu_ms_per_step_by_thread",
              "comm_thread_cpu_ms_per_step", "comm_thread_cpu_ns_per_gradient_byte"}


def _run(args: list[str], timeout: int = 240) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def c10d_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("c10d") / "c10d.json"
    _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "bench.c10d",
          "-b", "8", "-e", "1K", "-f", "8", "-r", "2", "-n", "3", "-w", "1", "--json", str(path)])
    return json.loads(path.read_text())


def test_c10d_rows_cover_every_op_size_and_impl(c10d_json):
    rows = c10d_json["rows"]
    assert c10d_json["header"]["ranks"] == 2
    sizes = [8, 64, 512]
    for op in CASES:
        for impl in ("dlop", "gloo", "fake"):
            mine = [r for r in rows if r["op"] == op and r["impl"] == impl]
            assert len(mine) == (1 if op == "barrier" else len(sizes)), (op, impl)
    for row in rows:
        assert C10D_FIELDS <= set(row), row
        assert row["ranks"] == 2 and row["time_us"] > 0 and row["cpu_us"] > 0
        # The fake group (the per-call floor) computes nothing, so it is not checked.
        assert row["wrong"] == (-1 if row["impl"] == "fake" else 0), row


def test_c10d_busbw_follows_nccl_tests_factors(c10d_json):
    for row in c10d_json["rows"]:
        if row["bytes"] == 0:
            continue
        factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(row["op"], 0.5)  # 2(n-1)/n, 1, else (n-1)/n; n = 2
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_us"] / 1e3)


@pytest.fixture(scope="module")
def ddp_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("ddp") / "ddp.json"
    _run(["-m", "bench.ddp", "--ranks", "2", "--models", "transformer", "--batch", "2", "--steps", "1",
          "--warmup", "0", "-r", "2", "--backends", "dlop,gloo,ideal", "--pin-cores", "--json", str(path)])
    return json.loads(path.read_text())


def test_ddp_rows_and_linearity(ddp_json):
    rows = {r["backend"]: r for r in ddp_json["rows"]}
    assert set(rows) == {"dlop", "gloo", "ideal", "none"}
    for row in rows.values():
        assert DDP_FIELDS <= set(row), row
        assert row["model"] == "transformer" and row["samples_per_s"] > 0
        # The ideal mode's ranks never exchange gradients: there is nothing to keep in sync.
        assert row["params_in_sync"] is (None if row["backend"] == "ideal" else True)
    assert rows["none"]["ranks"] == 1 and rows["none"]["linearity"] == pytest.approx(1.0)
    for backend in ("dlop", "gloo"):
        row = rows[backend]
        assert row["ranks"] == 2
        assert row["linearity"] == pytest.approx(row["samples_per_s"] / rows["none"]["samples_per_s"] / 2)
        # Two repetitions, whose median is their mean: the per-thread split adds up to the process's CPU, and the
        # all-reduces ran on the backend's own threads (dlop-progress; Gloo's pt_gloo_runloop), which the split names.
        assert sum(row["cpu_ms_per_step_by_thread"].values()) == pytest.approx(row["cpu_ms_per_step"])
        assert row["comm_thread_cpu_ms_per_step"] == row["cpu_ms_per_step_by_thread"][backend] > 0
    assert rows["none"]["comm_thread_cpu_ms_per_step"] == 0
    assert rows["ideal"]["ranks"] == 2 and rows["ideal"]["comm_thread_cpu_ms_per_step"] == 0
    for row in rows.values():  # two repetitions, and their median
        assert len(row["samples_per_s_runs"]) == 2
        assert row["samples_per_s"] == pytest.approx(sum(row["samples_per_s_runs"]) / 2)


def test_ddp_pins_its_ranks_to_their_cores(ddp_json):
    cpus = sorted(os.sched_getaffinity(0))
    assert ddp_json["header"]["pinned"] == sorted(pinned_cores(0, 2, cpus))


@pytest.mark.parametrize("ranks, cpus, expected", [
    (2, [0, 1], [{0}, {1}]),
    (4, [0, 1], [{0}, {1}, {0}, {1}]),  # two ranks a core, a host's ranks on different cores
    (2, [4, 5, 6, 7, 8], [{4, 5}, {6, 7}]),  # equal blocks; the fifth core idles
    (3, [0, 1], [None, None, None]),  # uneven: left to the kernel
    (1, [2, 3], [{2, 3}]),
])
def test_pinned_cores_share_the_cores_evenly(ranks, cpus, expected):
    assert [pinned_cores(r, ranks, cpus) for r in range(ranks)] == expected


def test_report_writes_markdown_for_both_kinds(c10d_json, ddp_json, tmp_path):
    files = []
    for name, data in (("c.json", c10d_json), ("d.json", ddp_json)):
        files.append(tmp_path / name)
        files[-1].write_text(json.dumps(data))
    out = tmp_path / "report.md"
    _run(["-m", "dlop.report.tables", *map(str, files), "--out", str(out)])
    text = out.read_text()
    assert "### all_reduce" in text and "busbw dlop/gloo" in text
    assert "| transformer |" in text


def test_report_plots_are_pngs(ddp_json, tmp_path):
    import struct

    import matplotlib.image

    path = tmp_path / "d.json"
    path.write_text(json.dumps(ddp_json))
    _run(["-m", "dlop.report.tables", str(path), "--out", str(tmp_path / "r.md"), "--plots", str(tmp_path / "plots")])
    raw = (tmp_path / "plots" / "ddp.png").read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    assert struct.unpack(">II", raw[16:24]) == (11 * 110, 4 * 110)  # plot_ddp: figsize (11, 4) at 110 dpi
    pixels = matplotlib.image.imread(tmp_path / "plots" / "ddp.png")
    assert pixels.shape[:2] == (440, 1210) and pixels.std() > 0.01


def test_c10d_on_the_test_accelerator_checks_every_op(tmp_path):
    path = tmp_path / "c10d_device.json"
    _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "bench.c10d",
          "--device", "dlop_test", "--impls", "dlop", "--sizes", "8,4K", "-r", "1", "-n", "2", "-w", "1",
          "--json", str(path)])
    rows = json.loads(path.read_text())["rows"]
    assert {r["op"] for r in rows} == set(CASES)
    assert all(r["impl"] == "dlop" and r["wrong"] == 0 for r in rows), rows


def test_device_bench_reports_staging_and_delegation(tmp_path):
    path = tmp_path / "device.json"
    _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "bench.device",
          "--size", "1M", "--copy-gbps", "25", "-r", "2", "--small-iters", "20", "--json", str(path)])
    rows = json.loads(path.read_text())["rows"]
    staging = [r for r in rows if r["bench"] == "staging"]
    assert len(staging) == 1 and staging[0]["staged_allreduce_ms"] > 0 and staging[0]["copy_gbps"] == 25
    delegation = [r for r in rows if r["bench"] == "delegation"]
    assert len(delegation) == 1 and delegation[0]["gloo_us"] > 0 and delegation[0]["delegated_us"] > 0
