"""python -m bench.autoscale --size tiny end to end on namespace hosts: the three fleets with their
figures, the peak and average fleets at their fixed sizes, and the autoscaled one grown from --min."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("dlop._C")

from bench.common import netns  # noqa: E402  (after the skips: it needs nothing, the run needs them)

pytestmark = pytest.mark.long_file(seconds=75)  # handed out first (conftest.py)
ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("samples_per_s", "stall_s", "stall_ratio", "core_seconds", "phases", "recover_steps", "trace", "daemons",
          "decisions")


def test_bench_autoscale_tiny(tmp_path):
    ok, why = netns.available()
    if not ok:
        pytest.skip(f"bench.autoscale runs on namespace hosts: {why}")
    out = tmp_path / "autoscale.json"
    run = subprocess.run([sys.executable, "-m", "bench.autoscale", "--size", "tiny", "--json", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    got = json.loads(out.read_text())
    rows = {r["fleet"]: r["runs"][0] for r in got["rows"]}
    assert sorted(rows) == ["auto", "average", "peak"]
    steps = sum(s for _, s, _ in got["header"]["phases"])
    for fleet, r in rows.items():
        for field in FIELDS:
            assert field in r, (fleet, field)
        assert len(r["trace"]) == steps and [p["phase"] for p in r["phases"]] == ["cheap", "costly", "cheap"]
        assert len(r["recover_steps"]) == 2
        for field in ("samples_per_s", "core_seconds"):
            assert math.isfinite(r[field]) and r[field] > 0, (fleet, field, r[field])
    assert {t[2] for t in rows["peak"]["trace"]} == {2} and {t[2] for t in rows["average"]["trace"]} == {1}
    sizes = [t[2] for t in rows["auto"]["trace"]]
    assert sizes[0] == 1 and max(sizes) > 1, sizes  # it grew in the costly phase
    assert any(d["target"] > 1 for d in rows["auto"]["decisions"])
    assert not rows["peak"]["decisions"] and not rows["average"]["decisions"]
    assert set(got["header"]["ratios"]["auto"]["met"]) == {"samples_per_s", "core_seconds", "recover_steps"}
    assert "auto vs peak:" in run.stdout
