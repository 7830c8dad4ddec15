"""python -m bench.pinned_pool end to end, tiny: both rows measured, and the copy row's pinned
allocation makes the host wait for the device every batch where the slot row's upload does not."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from processes import offloader

pytest.importorskip("torch")
pytest.importorskip("dlop._C")

ROOT = Path(__file__).resolve().parents[2]


def test_bench_pinned_pool_smoke(tmp_path):
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "bench.pinned_pool", "--images", "48", "--batch", "8", "--size", "32",
           "--reps", "1", "--offloader", offloader(), "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["row"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["copy", "slot"]
    for r in rows.values():
        assert r["batches_per_epoch"] == 5 and r["epochs"] == 1
        for key in ("thread_cpu_ms", "process_cpu_ms", "wall_ms"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["row"], key, r[key])
    assert rows["copy"]["host_waits"] >= 1  # each batch's pinned allocation waits for the devices
    assert rows["slot"]["host_waits"] < rows["copy"]["host_waits"]
    assert "slot/copy thread_cpu_ms" in run.stdout
