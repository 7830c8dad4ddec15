"""Per size: dlop / fake / gloo times, d/f and d/g per run and their medians,
from the bench JSONs named on the command line (grouped by their prefix before `_run`).

    python summarize.py before_run*.json after_run*.json
"""

import json
import statistics
import sys
from collections import defaultdict


def main(paths):
    runs = defaultdict(list)  # label -> [{(bytes, impl): time_us}]
    for path in paths:
        label = path.rsplit("/", 1)[-1].split("_run")[0]
        rows = json.load(open(path))["rows"]
        runs[label].append({(r["bytes"], r["impl"]): r["time_us"] for r in rows})
    print("| run set | size | dlop us (runs) | fake us | gloo us | d/f per run | d/f median | d/g median |")
    print("|---|---|---|---|---|---|---|---|")
    for label, sets in runs.items():
        for size in sorted({b for s in sets for b, _ in s}):
            t = {impl: [s[(size, impl)] for s in sets] for impl in ("dlop", "fake", "gloo")}
            df = [d / f for d, f in zip(t["dlop"], t["fake"])]
            dg = [d / g for d, g in zip(t["dlop"], t["gloo"])]
            print(f"| {label} | {size} B | {', '.join(f'{x:.1f}' for x in t['dlop'])} | "
                  f"{', '.join(f'{x:.1f}' for x in t['fake'])} | {statistics.median(t['gloo']):.0f} | "
                  f"{', '.join(f'{x:.2f}' for x in df)} | **{statistics.median(df):.2f}** | {statistics.median(dg):.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
