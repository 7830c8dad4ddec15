"""The GPU visit's scripts (scripts/gpu_plan.md) rehearsed on dlop_test, packed as the lent machine brings them back.

A command there brings back only what its $OUT holds, at most 8 files of 16 MiB, at most 2 folders down, and
is stopped at 10 minutes. Here scripts/gpu_headline.sh and scripts/gpu_check.sh run as the plan runs them
(DEV=dlop_test SIZE=tiny, into a fresh $OUT), and each run's $OUT must fit those limits, hold README.md with
its date, commit, machine and command, summary.json with the rows, and raw.tar.xz with every step's output. A
tiny budget must skip the steps with a note and still pack, so that a run cut short keeps what it measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("dlop._C")
pytest.importorskip("dlop.testing._accelerator")
pytest.importorskip("matplotlib")

from bench import train_device  # noqa: E402
from bench.pack_results import RETURN_LIMITS, return_problems  # noqa: E402

pytestmark = pytest.mark.long_file(seconds=200)
ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin")


def _script(argv: list[str], env: dict, timeout: float) -> tuple[int, str, float]:
    import sys

    full = dict(os.environ, PYTHON=sys.executable, DEV="dlop_test", SIZE="tiny", GPU_PREFLIGHT_SECONDS="120",
                PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def _returned(out: Path) -> dict:
    """The run's $OUT as the lent machine brings it back: it must all come back."""
    assert return_problems(out) == [], f"{out} would not come back whole: {return_problems(out)}"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert len(files) <= RETURN_LIMITS["files"]
    assert {"README.md", "summary.json", "raw.tar.xz"} <= set(files), files
    readme = (out / "README.md").read_text()
    for field in ("- Date: ", "- Commit: ", "- Machine: ", "- Command: "):
        assert field in readme, f"README.md lacks {field!r}"
    with tarfile.open(out / "raw.tar.xz") as tar:
        archived = set(tar.getnames())
    return {"files": files, "readme": readme, "archived": archived,
            "summary": json.loads((out / "summary.json").read_text())}


# Rows each in a process of its own on 2 cores take 20-60 s: the rehearsal runs the headline's three and the
# attribution's two (stock_uint8, native_local); tests/bench/test_bench_train_device.py runs every row.
IMAGE_ROWS = ("synthetic", "stock", "stock_uint8", "native_local", "dlop_offload")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for the trainer and one for offloaders")
def test_the_image_command_brings_back_its_rows_merged_into_one_table(tmp_path):
    out = tmp_path / "out"
    env = {"K": "1", "ROW_SECONDS": "1.5", "GPU_BUDGET": "900", "ROWS": " ".join(IMAGE_ROWS)}
    rc, log, took = _script(["scripts/gpu_headline.sh", "image", str(out)], env, timeout=900)
    assert rc == 0, log[-4000:]
    got = _returned(out)
    summary = got["summary"]
    assert [r["row"] for r in summary["rows"]] == [r for r in train_device.ROWS if r in IMAGE_ROWS]
    assert all(r["samples_per_s"] > 0 for r in summary["rows"])
    assert summary["header"]["skipped"] == {}
    assert "dlop_offload/stock" in summary["header"]["ratios"]
    assert "image.png" in got["files"] and "| dlop_offload |" in got["readme"]
    assert {"image.json", "steps.tsv", "preflight.txt"} <= got["archived"]
    assert {f"rows/{r}.json" for r in IMAGE_ROWS} <= got["archived"]
    assert "RESULT ok" in log
    print(f"image rehearsal: {took:.0f} s")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for the trainer and one for offloaders")
def test_the_video_command_packs_its_rows(tmp_path):
    out = tmp_path / "out"
    env = {"K": "1", "ROW_SECONDS": "1.5", "GPU_BUDGET": "600", "ROWS": "dlop_offload"}
    rc, log, took = _script(["scripts/gpu_headline.sh", "video", str(out)], env, timeout=600)
    assert rc == 0, log[-4000:]
    got = _returned(out)
    assert [r["row"] for r in got["summary"]["rows"]] == ["dlop_offload"]
    assert "video.png" in got["files"] and "video.json" in got["archived"]
    print(f"video rehearsal: {took:.0f} s")


def test_a_budget_too_small_skips_every_row_with_a_note_and_still_packs(tmp_path):
    """The clock is checked before each step: with 1 s of budget every row is skipped, named, and the run
    still packs what it has (the preflight) and says it is partial (exit 2)."""
    out = tmp_path / "out"
    rc, log, took = _script(["scripts/gpu_headline.sh", "image", str(out)], {"K": "1", "GPU_BUDGET": "1"},
                            timeout=120)
    assert rc == 2, log[-4000:]
    got = _returned(out)
    for row in train_device.ROWS:
        assert f"`row_{row}`: skipped (" in got["readme"], f"{row} is not named as skipped:\n{got['readme']}"
    assert "of the 1 s budget" in got["readme"]
    assert "RESULT partial" in log
    assert took < 60, f"a run with nothing to do took {took:.0f} s"


def test_a_missing_piece_is_named_by_the_preflight_and_the_run_still_packs(tmp_path):
    """/dev/shm smaller than the check asks for: the preflight names it, and nothing else runs."""
    out = tmp_path / "out"
    rc, log, _ = _script(["scripts/gpu_check.sh", "tests", str(out)],
                         {"GPU_PREFLIGHT_ARGS": "--shm-min-mib 100000000"}, timeout=120)
    assert rc == 1, log[-4000:]
    assert "MISSING shm" in log and "preflight: missing shm" in log
    got = _returned(out)
    assert "preflight.txt" in got["archived"] and "tests_shared.txt" not in got["archived"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks")
def test_the_ddp_check_asserts_the_shared_path_and_traces_the_staged_step(tmp_path):
    out = tmp_path / "out"
    # Each torchrun of 2 ranks takes 20-60 s on 2 cores: the steps new to the shared path and the staged trace.
    steps = "shared_probe ddp_staged_traced ddp_shared trace_summary ddp_vs_gloo"
    rc, log, took = _script(["scripts/gpu_check.sh", "ddp", str(out)], {"GPU_BUDGET": "900", "GPU_STEPS": steps},
                            timeout=900)
    assert rc == 0, log[-4000:]
    got = _returned(out)
    assert "rank 0: shared_device dlop_test:0" in log and "rank 1: shared_device dlop_test:0" in log
    assert "shared device memory: " in log
    assert {"ddp_staged_traced.txt", "trace_summary.json", "ddp_vs_gloo.json"} <= got["archived"]
    assert any(name.startswith("raw/trace/dlop-trace-") for name in got["archived"])
    assert set(got["summary"]["files"]) == {"ddp_vs_gloo.json", "preflight.json", "trace_summary.json"}
    print(f"ddp check rehearsal: {took:.0f} s")
