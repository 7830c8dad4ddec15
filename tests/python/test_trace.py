"""DLOP_TRACE: two ranks of backend "dlop" each write one Chrome trace file.

Every collective is one complete ("X") event named after the operation, with
its bytes, traffic class, algorithm and chunk count. Chunk events (data and
background all-reduces above DLOP_CHUNK_BYTES) are checked by
tests/scheduler/trace_test.cpp, which can submit those classes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from c10d_harness import Setup, run_ranks

CHUNK_BYTES = 64 << 10
LARGE = 100_003  # floats: 400,012 B, above DLOP_CHUNK_BYTES


def rank_collectives(ctx) -> int:
    import torch
    import torch.distributed as dist

    large = torch.full((LARGE,), float(ctx.rank + 1))
    dist.all_reduce(large)
    small = torch.ones(10)
    dist.all_reduce(small)
    dist.broadcast(small, src=0)
    assert large[0].item() == 3.0 and large[-1].item() == 3.0
    return os.getpid()


def run_traced(tmp_path: Path, classes: str) -> tuple[list[int], dict[int, list[dict]]]:
    trace_dir = tmp_path / f"trace-{classes}"
    env = {"DLOP_TRACE": str(trace_dir), "DLOP_CHUNK_BYTES": str(CHUNK_BYTES), "DLOP_TRAFFIC_CLASSES": classes}
    pids = run_ranks(rank_collectives, 2, setup=Setup(gloo=False, env=env))
    files = sorted(trace_dir.glob("dlop-trace-*.json"))
    by_pid = {}
    for f in files:
        doc = json.loads(f.read_text())
        events = doc["traceEvents"]
        assert events and all(e["ph"] == "X" for e in events), f
        pid = events[0]["pid"]
        assert f.name.endswith(f"-{pid}.json"), f
        assert all(e["pid"] == pid for e in events)
        by_pid[pid] = events
    assert sorted(by_pid) == sorted(pids), f"one file per rank process: {[f.name for f in files]}"
    return pids, by_pid


def ops_named(events: list[dict], name: str) -> list[dict]:
    return sorted((e for e in events if e["name"] == name), key=lambda e: e["ts"])


def test_trace_shows_every_collective(tmp_path):
    _, by_pid = run_traced(tmp_path, "1")
    for events in by_pid.values():
        allreduces = ops_named(events, "allreduce")
        big = [e for e in allreduces if e["args"]["bytes"] == LARGE * 4]
        small = [e for e in allreduces if e["args"]["bytes"] == 40]
        assert len(big) == 1 and len(small) == 1, allreduces
        assert len(ops_named(events, "broadcast")) == 1
        op = big[0]
        # Every collective of a process group is gradient traffic (DDP's buckets
        # cannot be told apart), and gradient ops are never chunked: nothing
        # is more urgent than they are.
        assert op["args"]["class"] == "gradient" and op["cat"] == "gradient"
        assert op["args"]["algorithm"], op
        assert op["args"]["chunks"] == 1 and small[0]["args"]["chunks"] == 1
        assert not [e for e in events if e["name"] == "allreduce chunk"]
        assert op["args"]["status"] == "done" and op["args"]["dtype"] == "float"
        assert all(e["dur"] >= 0 for e in events)
        # Submission order: the large all-reduce ended before the small one began.
        assert op["ts"] + op["dur"] <= small[0]["ts"] + 1


def test_report_trace_summarises_each_process(tmp_path, capsys):
    from dlop.report import trace

    _, by_pid = run_traced(tmp_path, "1")
    out = tmp_path / "summary.json"
    assert trace.main([str(tmp_path / "trace-1"), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert len(summary) == 2 and "allreduce" in capsys.readouterr().out
    for name, rows in summary.items():
        events = by_pid[int(name.rsplit("-", 1)[1].removesuffix(".json"))]
        by_key = {(r["op"], r["bytes"]): r for r in rows}
        assert sorted(by_key) == [("allreduce", 40), ("allreduce", LARGE * 4), ("broadcast", 40)], rows
        for (op, size), row in by_key.items():
            [event] = [e for e in events if e["name"] == op and e["args"]["bytes"] == size]
            assert row["count"] == 1
            assert row["ran_p50_us"] == row["ran_max_us"] == event["dur"]
            assert row["queued_p50_us"] == row["queued_max_us"] == event["args"]["queued_us"] >= 0


def test_report_trace_names_a_folder_without_traces(tmp_path):
    from dlop import cli

    with pytest.raises(SystemExit, match="no dlop-trace"):
        cli.main(["report", "trace", str(tmp_path)])
