"""PyTorch's own distributed tests (torch.testing._internal.distributed.distributed_test) on dlop.

By default: a representative subset that Gloo passes on this machine, run on
dlop as a plug-in and in dlop-as-gloo mode (see suite_cases.py); every test of
it must pass. With DLOP_TORCH_SUITE=full: the whole suite on Gloo, dlop and
dlop-as-gloo, and every test Gloo passes must pass in one of the dlop runs
unless docs/torch_suite_exclusions.md lists it with its reason.
(DLOP_TORCH_SUITE_WORLD_SIZE sets the ranks, 2 by default.)

Each run is a subprocess of run_suite.py; the suite's own per-test limit
kills the ranks of a hung test, and the subprocess has a limit of its own.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_suite import run_suite

HERE = Path(__file__).resolve().parent
FULL = os.environ.get("DLOP_TORCH_SUITE") == "full"
WORLD_SIZE = int(os.environ.get("DLOP_TORCH_SUITE_WORLD_SIZE", "2"))
PER_TEST_S = 120

# Collectives of every kind, p2p, groups, DDP: all pass with Gloo here.
SUBSET_PLUGIN = [
    "test_all_reduce_sum",
    "test_all_reduce_product",
    "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_gather_coalesced_simple",
    "test_all_gather_full_group",
    "test_broadcast",
    "test_reduce_max",
    "test_gather_checks",
    "test_scatter_complex",
    "test_send_recv_any_source",
    "test_send_recv_with_tag",
    "test_isend",
    "test_barrier_full_group",
    "test_destroy_group",
    "test_DistributedDataParallelCPU",
    "test_static_graph_api_cpu",
]
# Tests the suite gates on the name "gloo": they run only in dlop-as-gloo mode.
SUBSET_AS_GLOO = [
    "test_all_reduce_coalesced_sum",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_get_future",
    "test_batch_isend_irecv_gloo_tags",
    "test_all_gather_object_subgroup",
    "test_scatter_object_list",
    "test_barrier_timeout_full_group",
    "test_sparse_all_reduce_sum",
    "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_rank_0_timeout",
]


def _run_suite(backend: str, out: Path, names: list[str] | None, limit_s: int) -> dict[str, dict]:
    # torch's test harness imports expecttest, which torch does not install.
    assert importlib.util.find_spec("expecttest"), "torch's distributed tests need `expecttest` (requirements-dev.txt)"
    selection = ["--all"] if names is None else ["--tests", ",".join(names)]
    command = [sys.executable, "-m", "torch_suite.run_suite", "--backend", backend, "--world-size", str(WORLD_SIZE)]
    command += ["--timeout", str(PER_TEST_S), "--out", str(out), *selection]
    try:
        done = subprocess.run(command, cwd=HERE.parent, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{backend}: the suite did not finish in {limit_s} s\n{(e.stderr or '')[-3000:]}")
    assert done.returncode == 0, f"{backend}: run_suite failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return run_suite.load(out)


def _failures(rows: dict[str, dict], names: list[str]) -> str:
    lines = []
    for name in names:
        row = rows.get(name, {"status": "not run", "detail": ""})
        if row["status"] != "pass":
            lines.append(f"{name}: {row['status']}\n{row['detail'][-1500:]}")
    return "\n".join(lines)


@pytest.mark.skipif(FULL, reason="DLOP_TORCH_SUITE=full runs the whole suite instead")
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("backend", "names"), [("dlop", SUBSET_PLUGIN), ("dlop-as-gloo", SUBSET_AS_GLOO)])
def test_torch_suite_subset_passes_on_dlop(tmp_path, backend, names):
    rows = _run_suite(backend, tmp_path / f"{backend}.jsonl", names, limit_s=540)
    failed = _failures(rows, names)
    assert not failed, failed


@pytest.mark.skipif(not FULL, reason="set DLOP_TORCH_SUITE=full for the whole suite (about 6 minutes)")
@pytest.mark.timeout(3600)
def test_torch_suite_full_dlop_passes_what_gloo_passes(tmp_path):
    gloo = _run_suite("gloo", tmp_path / "gloo.jsonl", None, limit_s=1500)
    plugin = _run_suite("dlop", tmp_path / "dlop.jsonl", None, limit_s=1500)
    as_gloo = _run_suite("dlop-as-gloo", tmp_path / "as-gloo.jsonl", None, limit_s=1500)
    assert sum(r["status"] == "pass" for r in gloo.values()) > 0, "Gloo passed nothing: the harness is broken"
    unexplained, _excluded = run_suite.regressions(gloo, run_suite.best_of([plugin, as_gloo]), run_suite.load_exclusions())
    assert not unexplained, _failures(as_gloo, unexplained)
