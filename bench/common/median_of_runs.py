#!/usr/bin/env python3
"""Medians over several dlop-bench --json runs of the same command.

Per (bytes, place) row: the median of dlop's and MPI's times over the runs, and
the median of each run's own ratio (a ratio is only meaningful inside the run
that measured both sides, so ratios are never formed across runs).

    python3 bench/common/median_of_runs.py run1.json run2.json run3.json
"""
import json
import statistics
import sys


def load(path):
    with open(path) as f:
        doc = json.load(f)
    rows = {}
    for r in doc["rows"]:
        rows[(r["bytes"], r["inplace"], r["impl"])] = r
    return doc["header"], rows


def main(paths):
    runs = [load(p) for p in paths]
    header = runs[0][0]
    keys = sorted({(b, i) for _, rows in runs for (b, i, _impl) in rows})
    print(f"# median of {len(runs)} runs: {' '.join(paths)}")
    print(f"# {header['op']}, {header['ranks']} ranks, {header['dtype']} {header['redop']}; "
          f"MPI environment {header.get('environment', {})}")
    print("# busbw ratio dlop/MPI (> 1: dlop faster); time ratio dlop/MPI (< 1: dlop faster) for S <= 4K;"
          " each ratio taken inside one run, then the median over runs; [min-max] over runs")
    print(f"{'bytes':>11} {'place':>5} | {'dlop us':>10} {'MPI us':>10} | {'busbw d/M':>9} {'range':>13} |"
          f" {'time d/M':>8} {'range':>13} | wrong")
    for b, inplace in keys:
        per = [(rows.get((b, inplace, "dlop")), rows.get((b, inplace, "mpi"))) for _, rows in runs]
        per = [(d, m) for d, m in per if d and m]
        if not per:
            continue
        dt = statistics.median(d["time_us"] for d, _ in per)
        mt = statistics.median(m["time_us"] for _, m in per)
        bw = [d["busbw_gbps"] / m["busbw_gbps"] for d, m in per if m["busbw_gbps"] > 0]
        tr = [d["time_us"] / m["time_us"] for d, m in per]
        wrong = sum(d["wrong"] + m["wrong"] for d, m in per)
        rng = lambda xs: f"[{min(xs):.2f}-{max(xs):.2f}]"
        tcol = f"{statistics.median(tr):8.2f} {rng(tr):>13}" if b <= 4096 else f"{'-':>8} {'':>13}"
        print(f"{b:>11} {'in' if inplace else 'out':>5} | {dt:>10.2f} {mt:>10.2f} |"
              f" {statistics.median(bw):9.2f} {rng(bw):>13} | {tcol} | {wrong}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
