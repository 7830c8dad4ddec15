"""A guard against gross CPU regressions of the backend in DDP training.

On a CPU-starved host, every microsecond the backend spends is taken from the
backward pass it overlaps, so dlop's CPU per DDP step must stay near Gloo's
(the benchmark, ``python -m bench.ddp``, holds the real target: at most
Gloo's). This runs the benchmark's short comparison, dlop and Gloo
alternating in the same processes, and fails when dlop's CPU per rank and step
exceeds Gloo's by more than MARGIN: a progress thread that spins through the
backward pass, or a wait that never sleeps, costs far more than that. It is a
guard, not a measurement: the margin absorbs a loaded machine's noise.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MARGIN = 1.5
ROOT = Path(__file__).resolve().parents[2]  # where `python -m bench.ddp` finds the benchmark lab


@pytest.mark.alone(reason="a ratio of CPU times, which another process's load moves")
def test_dlop_cpu_per_ddp_step_stays_near_gloos(tmp_path):
    path = tmp_path / "ddp.json"
    args = [sys.executable, "-m", "bench.ddp", "--ranks", "2", "--threads", "1", "--models", "transformer",
            "--batch", "4", "--steps", "4", "--warmup", "1", "-r", "3", "--no-single", "--no-progress",
            "--json", str(path)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    rows = {r["backend"]: r for r in json.loads(path.read_text())["rows"]}
    dlop, gloo = rows["dlop"], rows["gloo"]
    assert dlop["params_in_sync"] and gloo["params_in_sync"]
    assert gloo["cpu_ms_per_step"] > 0
    ratio = dlop["cpu_ms_per_step"] / gloo["cpu_ms_per_step"]
    assert ratio <= MARGIN, (
        f"dlop's CPU per rank and step is {ratio:.2f}x Gloo's (limit {MARGIN}x): "
        f"dlop {dlop['cpu_ms_per_step']:.1f} ms {dlop['cpu_ms_per_step_by_thread']}, "
        f"Gloo {gloo['cpu_ms_per_step']:.1f} ms {gloo['cpu_ms_per_step_by_thread']}\n{done.stdout}")
