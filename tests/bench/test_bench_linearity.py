"""python -m bench.linearity: the runner that measures the linearity report's terms and checks.

Its own options are checked like the report's; and a small report on real
namespace hosts (2 hosts x 1 rank, 1 Gbit/s tbf, a small model, few steps)
runs end to end: its measured all-reduce cannot beat the link, and the link
it calibrates is the shaped one. (The report itself, on made-up
measurements, is tests/python/test_linearity.py.)
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.linearity import linearity as runner
from dlop.report import linearity_report as lr, linearity_terms as lt
from linearity_tables import assert_tables_match_json

pytestmark = pytest.mark.long_file(seconds=100)  # handed out first (conftest.py)

MIB = 2**20


@pytest.mark.parametrize("args, words", [(["--layouts", "1x2"], "at least 2 hosts"), (["--models", "nope"], "nope"),
                                         (["--link-gbps", "0"], "positive"), (["--runs", "0"], "positive"),
                                         (["--net-cpu-ns", "-1"], "0 or more")])
def test_bad_arguments_name_the_problem(tmp_path, capsys, args, words):
    with pytest.raises(SystemExit) as stop:
        runner.main(["--out", str(tmp_path), *args])
    assert stop.value.code == 2 and words in capsys.readouterr().err


def test_multihost_report_on_namespace_hosts(tmp_path):
    from bench.common import netns

    ok, why = netns.available()
    if not ok:
        pytest.skip(f"network namespaces cannot be made here: {why}")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bench.linearity", "--layouts", "2x1", "--rates", "1gbit",
                           "--runs", "1", "--sizes", "1M", "--batch", "2", "--steps", "1", "--warmup", "1", "-r", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    elapsed = time.monotonic() - start
    data = assert_tables_match_json(tmp_path)
    terms = {(t["term"], t["scope"]): t["median"] for t in data["calibration"]}
    assert 0 < terms[("net_gbps", "1gbit")] <= 1.0  # the 1 Gbit/s tbf caps it (a busy machine may carry less)
    assert terms[("intra_gbps", "dlop")] > 4 * terms[("net_gbps", "1gbit")]  # shared memory beats the link
    cores = data["header"]["cores"]
    assert all(terms[("crowding", f"{b}, {lt.crowded_ranks(cores)} ranks on {cores} cores")] > 0 for b in lr.BACKENDS)
    for a in data["checks"]["allreduce"]:
        assert a["measured_ms"] >= MIB * 8 / 1e9 * 1e3  # 2 ranks: each sends 1 MiB across the 1 Gbit/s link
    ddp = [(c["backend"], c["rate"], c["hosts"], c["per_host"]) for c in data["checks"]["ddp"] if not c["in_sample"]]
    assert sorted(ddp) == [("dlop", "1gbit", 2, 1), ("gloo", "1gbit", 2, 1)]
    # Batches of 2 compute for tens of ms; 16 MiB of gradient take over 130 ms on the link, some of it exposed
    # however much a busy machine slows the compute.
    assert all(0 < c["measured"] < 1 for c in data["checks"]["ddp"] if not c["in_sample"])
    assert (tmp_path / "raw" / "net_1gbit_0.json").is_file() and (tmp_path / "raw" / "ddp_1gbit_2x1_0.json").is_file()
    print(f"multi-host linearity report: {elapsed:.0f} s")
