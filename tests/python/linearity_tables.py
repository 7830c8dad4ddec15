"""The linearity report's markdown tables read back, and checked cell by cell against its JSON
(test_linearity.py on made-up measurements, tests/bench/test_bench_linearity.py on a measured run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest


def _table(markdown: str, section: str) -> list[dict]:
    """The first table after the heading `section`, as dicts keyed by its header cells."""
    lines = markdown[markdown.index(section):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(head, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def assert_tables_match_json(folder: Path) -> dict:
    data, text = json.loads((folder / "linearity.json").read_text()), (folder / "linearity.md").read_text()
    ddp = _table(text, "### DDP linearity")
    assert len(ddp) == len(data["checks"]["ddp"]) > 0
    for cells, c in zip(ddp, data["checks"]["ddp"]):
        assert (cells["backend"], cells["layout"]) == (c["backend"], f"{c['hosts']}x{c['per_host']}")
        assert cells["link"] == (c["rate"] or "this host")
        for column, key in (("measured", "measured"), ("predicted", "predicted"), ("error", "error")):
            assert float(cells[column]) == pytest.approx(c[key], abs=5.1e-4)
        assert cells["within 0.05"] == ("in sample" if c["in_sample"] else "yes" if c["within_target"] else "**no**")
        assert [float(x) for x in cells["band"].split(" - ")] == pytest.approx(c["band"], abs=5.1e-4)
    allreduce = _table(text, "### All-reduce time")
    assert len(allreduce) == len(data["checks"]["allreduce"]) > 0
    for cells, a in zip(allreduce, data["checks"]["allreduce"]):
        assert float(cells["measured (ms)"]) == pytest.approx(a["measured_ms"], abs=0.0051)
        assert float(cells["predicted (ms)"]) == pytest.approx(a["predicted_ms"], abs=0.0051)
        assert float(cells["error (%)"]) == pytest.approx(100 * a["error"], abs=0.051)
    winners = _table(text, "### Ring or hierarchical") if data["checks"]["winners"] else []
    assert len(winners) == len(data["checks"]["winners"])
    for cells, w in zip(winners, data["checks"]["winners"]):
        assert (cells["measured winner"], cells["predicted winner"]) == (w["measured"], w["predicted"])
        assert [float(x) for x in cells["each run"].split(", ")] == pytest.approx(w["measured_runs_ratio"], abs=0.0051)
        assert cells["agree"] == ("yes" if w["agree"] else "**no**")
    t = data["targets"]
    assert f"Met at **{t['ddp_within']} of {t['ddp_points']}** DDP points" in text
    terms = _table(text, "## Calibration")
    assert [float(c["median"]) for c in terms] == pytest.approx([t["median"] for t in data["calibration"]], rel=1e-3)
    predicted = _table(text, "## Predictions")
    assert len(predicted) == len(data["predicted"])
    for cells, p in zip(predicted, data["predicted"]):
        for n, value in p["linearity"].items():
            cell = re.fullmatch(r"([0-9.]+) \(([0-9.]+)-([0-9.]+)\)", cells[f"N = {n}"])
            assert float(cell.group(1)) == pytest.approx(value, abs=5.1e-4)
            assert [float(cell.group(2)), float(cell.group(3))] == pytest.approx(p["band"][n], abs=5.1e-4)
    return data
