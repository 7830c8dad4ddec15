"""The GPU visit's scripts (scripts/gpu_plan.md) rehearsed on dlop_test, packed as the lent machine brings them back.

A command there brings back only what its $OUT holds, at most 8 files of 16 MiB, at most 2 folders down, and
is stopped at 10 minutes. Here scripts/gpu_headline.sh and scripts/gpu_check.sh run as the plan runs them
(DEV=dlop_test SIZE=tiny, into a fresh $OUT), and each run's $OUT must fit those limits, hold README.md with
its date, commit, machine and command, summary.json with the rows, and raw.tar.xz with every step's output. A
tiny budget must skip the steps with a note and still pack, so that a run cut short keeps what it measured, and
a missing piece must be named by the preflight. The video and DDP commands: test_gpu_plan_check.py.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("dlop._C")
pytest.importorskip("dlop.testing._accelerator")
pytest.importorskip("matplotlib")

from bench.train import train_device  # noqa: E402
from gpu_rehearsal import returned, run_script  # noqa: E402

pytestmark = pytest.mark.long_file(seconds=150)


# A row in processes of its own takes 20-60 s on 2 cores: the rehearsal runs two, enough for the merge's
# ratios; tests/bench/test_bench_train_device.py runs every row.
IMAGE_ROWS = ("stock", "dlop_offload")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for the trainer and one for offloaders")
def test_the_image_command_brings_back_its_rows_merged_into_one_table(tmp_path):
    out = tmp_path / "out"
    env = {"K": "1", "ROW_SECONDS": "1", "GPU_BUDGET": "900", "ROWS": " ".join(IMAGE_ROWS)}
    rc, log, took = run_script(["scripts/gpu_headline.sh", "image", str(out)], env, timeout=900)
    assert rc == 0, log[-4000:]
    got = returned(out)
    summary = got["summary"]
    assert [r["row"] for r in summary["rows"]] == [r for r in train_device.ROWS if r in IMAGE_ROWS]
    assert all(r["samples_per_s"] > 0 for r in summary["rows"])
    assert summary["header"]["skipped"] == {}
    assert "dlop_offload/stock" in summary["header"]["ratios"]
    assert "image.png" in got["files"] and "| dlop_offload |" in got["readme"]
    assert {"image.json", "steps.tsv", "preflight.txt", "raw/preflight.json"} <= got["archived"]
    assert {f"raw/rows/{r}.json" for r in IMAGE_ROWS} <= got["archived"]
    assert "RESULT ok" in log
    print(f"image rehearsal: {took:.0f} s")


def test_a_budget_too_small_skips_every_row_with_a_note_and_still_packs(tmp_path):
    """The clock is checked before each step: with 1 s of budget every row is skipped, named, and the run
    still packs what it has (the preflight) and says it is partial (exit 2)."""
    out = tmp_path / "out"
    rc, log, _ = run_script(["scripts/gpu_headline.sh", "image", str(out)], {"K": "1", "GPU_BUDGET": "1"},
                            timeout=180)
    assert rc == 2, log[-4000:]
    got = returned(out, summary=False)
    for row in train_device.ROWS:
        assert f"`row_{row}`: skipped (" in got["readme"], f"{row} is not named as skipped:\n{got['readme']}"
    assert "of the 1 s budget" in got["readme"]
    assert "RESULT partial" in log
    assert not any(f.startswith("raw/rows/") for f in got["archived"]), got["archived"]  # no row ran


def test_a_missing_piece_is_named_by_the_preflight_and_the_run_still_packs(tmp_path):
    """/dev/shm smaller than the check asks for: the preflight names it, and nothing else runs."""
    out = tmp_path / "out"
    rc, log, _ = run_script(["scripts/gpu_check.sh", "tests", str(out)],
                            {"GPU_PREFLIGHT_ARGS": "--shm-min-mib 100000000"}, timeout=180)
    assert rc == 1, log[-4000:]
    assert "MISSING shm" in log and "preflight: missing shm" in log
    got = returned(out, summary=False)
    assert "preflight.txt" in got["archived"] and "tests_shared.txt" not in got["archived"]


