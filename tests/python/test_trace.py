"""DLOP_TRACE: two ranks of backend "dlop" each write one Chrome trace file.

Every collective is one complete ("X") event named after the operation, with
its bytes, traffic class, algorithm and chunk count; an all-reduce above
DLOP_CHUNK_BYTES also has one event per chunk, in order, inside the op's
span. With DLOP_TRAFFIC_CLASSES=0 nothing is chunked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from c10d_harness import Setup, run_ranks

CHUNK_BYTES = 64 << 10
LARGE = 100_003  # floats: 400,012 B, 7 chunks of at most 64 KiB


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


def test_trace_shows_every_collective_and_its_chunks(tmp_path):
    _, by_pid = run_traced(tmp_path, "1")
    for pid, events in by_pid.items():
        allreduces = ops_named(events, "allreduce")
        big = [e for e in allreduces if e["args"]["bytes"] == LARGE * 4]
        small = [e for e in allreduces if e["args"]["bytes"] == 40]
        assert len(big) == 1 and len(small) == 1, allreduces
        assert len(ops_named(events, "broadcast")) == 1
        op = big[0]
        assert op["args"]["class"] == "gradient" and op["cat"] == "gradient"
        assert op["args"]["algorithm"], op
        assert op["args"]["chunks"] == 7 and small[0]["args"]["chunks"] == 1
        assert op["args"]["status"] == "done" and op["args"]["dtype"] == "float"
        chunks = sorted((e for e in events if e["name"] == "allreduce chunk"), key=lambda e: e["args"]["chunk"])
        assert [c["args"]["chunk"] for c in chunks] == list(range(7))
        assert all(c["args"]["op_seq"] == op["args"]["seq"] for c in chunks)
        assert [c["args"]["seq"] for c in chunks] == [op["args"]["seq"] + i for i in range(7)]
        assert sum(c["args"]["bytes"] for c in chunks) == LARGE * 4
        assert max(c["args"]["bytes"] for c in chunks) <= CHUNK_BYTES
        # Chunks run one after another, inside the op's span.
        for a, b in zip(chunks, chunks[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1, (a, b)
        assert op["ts"] <= chunks[0]["ts"] and chunks[-1]["ts"] + chunks[-1]["dur"] <= op["ts"] + op["dur"] + 1
        assert all(e["dur"] >= 0 for e in events)
        # Submission order: the large all-reduce started before the small one.
        assert op["ts"] <= small[0]["ts"]


def test_traffic_classes_off_chunks_nothing(tmp_path):
    _, by_pid = run_traced(tmp_path, "0")
    for events in by_pid.values():
        assert not [e for e in events if e["name"] == "allreduce chunk"]
        assert all(e["args"]["chunks"] == 1 for e in ops_named(events, "allreduce"))
