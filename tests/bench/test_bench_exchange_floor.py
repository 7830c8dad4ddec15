"""bench/collectives/exchange_floor.c, the two-core floor of a small blocking all-reduce: it builds, runs briefly at
both sizes the c10d results quote (8 B and 4 KiB), checks its own sums and prints one line per size."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "bench" / "collectives" / "exchange_floor.c"
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin its threads to")
@pytest.mark.parametrize("nb", [8, 4096])
def test_exchange_floor_runs(tmp_path, nb):
    exe = tmp_path / f"exchange_floor_{nb}"
    subprocess.run([CC, "-O2", "-Wall", "-Werror", "-pthread", f"-DNB={nb}", str(SOURCE), "-o", str(exe)],
                   check=True, capture_output=True, text=True, timeout=60)
    a, b = _cpus()[:2]
    done = subprocess.run([str(exe), "2000", str(a), str(b)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    m = re.fullmatch(rf"{nb} B: ([0-9.]+) ns per exchange \(2000 exchanges, CPUs {a} and {b}\)\n", done.stdout)
    assert m and float(m.group(1)) > 0, done.stdout


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_exchange_floor_refuses_bad_arguments(tmp_path):
    exe = tmp_path / "exchange_floor"
    subprocess.run([CC, "-O2", "-pthread", str(SOURCE), "-o", str(exe)], check=True, capture_output=True, timeout=60)
    for args in (["0"], ["10", "0"], ["x"]):
        done = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=10)
        assert done.returncode == 2 and "usage" in done.stderr, (args, done.stderr)
