#!/usr/bin/env python3
"""What scripts/gpu_check.sh ddp's steps measured, as figures (ddp_vs_gloo.json) and checks.

    scripts/gpu_ddp_summary.py ddp-vs-gloo WORK     images/s of each examples/imagenet_ddp.py run in WORK
    scripts/gpu_ddp_summary.py device-path JSON     bench.ddp_overlap's dlop rows all reduced in shared memory

ddp-vs-gloo reads each run's "epoch N: ... X images/s" lines (ddp_staged,
ddp_gloo, ddp_staged_traced, ddp_shared), takes the median of the epochs after
the first (cuDNN's autotuning and the allocator warm up in it), writes
WORK/ddp_vs_gloo.json and prints each run's images/s and its ratio to Gloo's.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

RUNS = ("ddp_staged", "ddp_gloo", "ddp_staged_traced", "ddp_shared")


def ddp_vs_gloo(work: Path) -> int:
    rates = {}
    for name in RUNS:
        path = work / f"{name}.txt"
        if path.exists():
            rates[name] = [float(v) for v in re.findall(r"epoch \d+: .* ([\d.]+) images/s", path.read_text())]
    steady = {k: statistics.median(v[1:] or v) for k, v in rates.items() if v}
    gloo = steady.get("ddp_gloo")
    ratios = {f"{k}/ddp_gloo": v / gloo for k, v in steady.items() if gloo and k != "ddp_gloo"}
    with open(work / "ddp_vs_gloo.json", "w") as f:
        json.dump({"images_per_s_by_epoch": rates, "steady_images_per_s": steady, "ratios": ratios}, f, indent=2)
    for k, v in steady.items():
        ratio = ratios.get(f"{k}/ddp_gloo")
        print(f"{k}: {v:.1f} images/s" + (f", {ratio:.2f}x Gloo's" if ratio else ""))
    return 0 if steady else 1


def device_path(path: Path) -> int:
    paths = [r["device_path"] for r in json.loads(path.read_text())["rows"] if r["backend"] == "dlop"]
    print(f"   device_path: {', '.join(paths) or 'no dlop row'}")
    return 0 if paths and set(paths) == {"shared"} else 1


if __name__ == "__main__":
    what, arg = sys.argv[1:3]
    sys.exit({"ddp-vs-gloo": ddp_vs_gloo, "device-path": device_path}[what](Path(arg)))
