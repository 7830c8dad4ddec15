"""The GPU visit's second halves (scripts/gpu_plan.md) rehearsed on dlop_test: the headline's video command, and
gpu_check.sh's DDP command, whose shared-path steps must assert that the ranks reduced in the device's memory
and whose staged DDP step must bring back its trace. Each $OUT must come back whole (gpu_rehearsal.returned).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("dlop._C")
pytest.importorskip("dlop.testing._accelerator")
pytest.importorskip("matplotlib")

from gpu_rehearsal import returned, run_script  # noqa: E402

pytestmark = pytest.mark.long_file(seconds=200)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core for the trainer and one for offloaders")
def test_the_video_command_packs_its_rows(tmp_path):
    out = tmp_path / "out"
    env = {"K": "1", "ROW_SECONDS": "1", "GPU_BUDGET": "600", "ROWS": "dlop_offload"}
    rc, log, took = run_script(["scripts/gpu_headline.sh", "video", str(out)], env, timeout=600)
    assert rc == 0, log[-4000:]
    got = returned(out)
    assert [r["row"] for r in got["summary"]["rows"]] == ["dlop_offload"]
    assert "video.png" in got["files"] and {"video.json", "raw/rows/dlop_offload.json"} <= got["archived"]
    print(f"video rehearsal: {took:.0f} s")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks")
def test_the_ddp_check_asserts_the_shared_path_and_traces_the_staged_step(tmp_path):
    out = tmp_path / "out"
    # Each torchrun of 2 ranks takes 20-60 s on 2 cores: the steps new to the shared path and the staged trace.
    steps = "shared_probe ddp_staged_traced ddp_shared trace_summary ddp_vs_gloo"
    rc, log, took = run_script(["scripts/gpu_check.sh", "ddp", str(out)], {"GPU_BUDGET": "900", "GPU_STEPS": steps},
                               timeout=900)
    assert rc == 0, log[-4000:]
    got = returned(out)
    assert "rank 0: shared_device dlop_test:0" in log and "rank 1: shared_device dlop_test:0" in log
    assert "shared device memory: " in log
    assert {"ddp_staged_traced.txt", "trace_summary.json", "ddp_vs_gloo.json"} <= got["archived"]
    assert any(name.startswith("raw/trace/dlop-trace-") for name in got["archived"])
    assert set(got["summary"]["files"]) == {"ddp_vs_gloo.json", "trace_summary.json"}
    assert "`overlap_shared`: not run (not in GPU_STEPS)" in got["readme"]
    print(f"ddp check rehearsal: {took:.0f} s")
