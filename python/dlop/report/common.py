"""What the reports share: sizes as text, medians and percentiles, a benchmark JSON file's rows."""

from __future__ import annotations

import json

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}  # binary, as dlop-bench reads and writes sizes


def format_size(size: int) -> str:
    for unit in ("G", "M", "K"):
        if size >= UNITS[unit] and size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return str(size)


def percentile(values, q: float) -> float:
    """The value at fraction q of the sorted values (nearest rank); 0 for none."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def median(values) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def read_rows(path: str) -> tuple[dict, list[dict]]:
    """A benchmark's JSON file: {"header", "rows"} (ours and dlop-bench's) or a bare list of rows."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, list):
        return {}, data
    return data.get("header", {}), data.get("rows", [])
