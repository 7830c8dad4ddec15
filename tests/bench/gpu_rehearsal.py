"""Runs a GPU script of scripts/gpu_plan.md on dlop_test, and reads its $OUT as the lent machine brings it back.

Shared by tests/bench/test_gpu_plan.py (the headline's commands) and test_gpu_plan_check.py (gpu_check.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench.common.pack_results import RETURN_LIMITS, return_problems

ROOT = Path(__file__).resolve().parents[2]


def run_script(argv: list[str], env: dict, timeout: float) -> tuple[int, str, float]:
    """(exit status, output, seconds) of a script run as the plan runs it, with DEV=dlop_test SIZE=tiny.

    The preflight's 15 s is for the GPU machine's 16 idle cores: imports on 2 busy ones take longer.
    """
    full = dict(os.environ, PYTHON=sys.executable, DEV="dlop_test", SIZE="tiny", GPU_PREFLIGHT_SECONDS="120",
                PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def returned(out: Path, summary: bool = True) -> dict:
    """The run's $OUT: it must all come back, a packed run folder with README.md's date, commit, machine and
    command, raw.tar.xz, and summary.json where the run measured something."""
    assert return_problems(out) == [], f"{out} would not come back whole: {return_problems(out)}"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert len(files) <= RETURN_LIMITS["files"]
    assert {"README.md", "raw.tar.xz"} <= set(files), files
    assert ("summary.json" in files) == summary, files
    readme = (out / "README.md").read_text()
    for field in ("- Date: ", "- Commit: ", "- Machine: ", "- Command: "):
        assert field in readme, f"README.md lacks {field!r}"
    with tarfile.open(out / "raw.tar.xz") as tar:
        archived = set(tar.getnames())
    return {"files": files, "readme": readme, "archived": archived,
            "summary": json.loads((out / "summary.json").read_text()) if summary else None}
