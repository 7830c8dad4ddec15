"""python -m dlop.bench.offload end to end on a tiny dataset: every row's fields,
finite positive figures, and the python row either measured or said unavailable."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("dlop._C")

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("pipeline", "workers", "samples_per_s", "cpu_s_per_sample", "trainer_cpu_s_per_sample", "peak_rss_mib")


def _offloader() -> str:
    for c in (os.environ.get("DLOP_OFFLOADER", ""), str(ROOT / ".venv/bin/dlop-offloader"),
              str(ROOT / "build/offload/dlop-offloader")):
        if c and os.access(c, os.X_OK):
            return c
    pytest.skip("dlop-offloader is not built (make build, or set DLOP_OFFLOADER)")


def test_bench_offload_smoke(tmp_path):
    from dlop.data.make_dataset import main as make_dataset

    data = tmp_path / "data"
    assert make_dataset([str(data), "--classes", "3", "--per-class", "8", "--seed", "1"]) == 0
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "dlop.bench.offload", "--data", str(data), "--batch", "4", "--size", "32",
           "-k", "1", "-r", "1", "--batches", "3", "--scaling", "--offloader", _offloader(), "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["pipeline"] for r in rows] == ["dataloader", "native", "python", "native"]
    assert [r.get("offloaders") for r in rows if r["pipeline"] == "native"] == [1, 2]
    for r in rows:
        if "unavailable" in r:
            assert r["pipeline"] == "python", r  # only the generic path may be missing
            continue
        for field in FIELDS:
            assert field in r, (field, r)
        for field in FIELDS[2:]:
            assert math.isfinite(r[field]) and r[field] > 0, (field, r)
    assert "samples per CPU-second" in run.stdout and "scaling: 2 offloaders" in run.stdout
