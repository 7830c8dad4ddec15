"""Benchmark JSON -> markdown tables and PNG plots.

    dlop report c10d_run1.json c10d_run2.json ... [--plots DIR] [--out FILE.md]     (python -m dlop.report.tables)

Reads the files of ``bench.c10d`` and ``dlop-bench`` (rows with ``op``)
and of ``bench.ddp`` (rows with ``model``). Several files of one kind are
runs of the same benchmark: each figure becomes the median over the runs that
have it (the "runs" column says how many), which is how numbers from this
noisy, shared machine should be quoted. Plots need matplotlib; without it the
tables are still written and one message says the plots were skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

from dlop.report.common import format_size, median, read_rows

_IMPL_ORDER = {"dlop": 0, "gloo": 1, "mpi": 2, "none": 3}


def _impl_key(impl: str):
    return _IMPL_ORDER.get(impl, 9), impl


def merge_collective(runs: list[list[dict]]) -> dict:
    """{(op, inplace): {bytes: {impl: merged row}}}, figures the median over runs."""
    grouped = defaultdict(list)
    for rows in runs:
        for r in rows:
            grouped[(r["op"], bool(r.get("inplace", False)), r["bytes"], r["impl"])].append(r)
    table = defaultdict(lambda: defaultdict(dict))
    for (op, inplace, size, impl), rows in grouped.items():
        merged = dict(rows[0])
        for field in ("time_us", "algbw_gbps", "busbw_gbps"):
            merged[field] = median([r[field] for r in rows])
        merged["wrong"] = sum(max(r.get("wrong", 0), 0) for r in rows)
        merged["runs"] = len(rows)
        table[(op, inplace)][size][impl] = merged
    return table


def collective_markdown(table: dict) -> str:
    out = []
    for (op, inplace), by_size in sorted(table.items()):
        impls = sorted({impl for cells in by_size.values() for impl in cells}, key=_impl_key)
        others = [i for i in impls if i != "dlop"] if "dlop" in impls else []
        first = next(iter(next(iter(by_size.values())).values()))
        out.append(f"### {op} ({first.get('dtype', '-')}, {first['ranks']} ranks, {'in place' if inplace else 'out of place'})\n")
        head = ["size"] + [f"{i} time (us)" for i in impls] + [f"time dlop/{o}" for o in others]
        head += [f"{i} busbw (GB/s)" for i in impls] + [f"busbw dlop/{o}" for o in others] + ["#wrong", "runs"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---:|" * len(head))
        for size in sorted(by_size):
            cells = by_size[size]
            line = [format_size(size) if size else "-"]
            line += [f"{cells[i]['time_us']:.2f}" if i in cells else "-" for i in impls]
            for o in others:
                ok = "dlop" in cells and o in cells and cells[o]["time_us"] > 0
                line.append(f"{cells['dlop']['time_us'] / cells[o]['time_us']:.3f}" if ok else "-")
            line += [f"{cells[i]['busbw_gbps']:.2f}" if i in cells and size else "-" for i in impls]
            for o in others:
                ok = size and "dlop" in cells and o in cells and cells[o]["busbw_gbps"] > 0
                line.append(f"{cells['dlop']['busbw_gbps'] / cells[o]['busbw_gbps']:.2f}" if ok else "-")
            line.append(" / ".join(str(cells[i]["wrong"]) for i in impls if i in cells))
            line.append(str(max(c["runs"] for c in cells.values())))
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    return "\n".join(out)


def merge_ddp(runs: list[list[dict]]) -> dict:
    """{model: {backend: merged row}}, samples/s and linearity the median over runs."""
    grouped = defaultdict(list)
    for rows in runs:
        for r in rows:
            grouped[(r["model"], r["backend"])].append(r)
    table = defaultdict(dict)
    for (model, backend), rows in grouped.items():
        merged = dict(rows[0])
        merged["samples_per_s"] = median([r["samples_per_s"] for r in rows])
        known = [r["linearity"] for r in rows if r.get("linearity") is not None]
        merged["linearity"] = median(known) if known else None
        merged["runs"] = len(rows)
        table[model][backend] = merged
    return table


def ddp_markdown(table: dict) -> str:
    out = ["| model | gradient (MiB) | backend | ranks | samples/s | linearity | vs gloo | runs |",
           "|---|---:|---|---:|---:|---:|---:|---:|"]
    for model, by_backend in table.items():
        gloo = by_backend.get("gloo")
        for backend in sorted(by_backend, key=_impl_key):
            r = by_backend[backend]
            vs = f"{r['samples_per_s'] / gloo['samples_per_s']:.2f}" if gloo and backend != "none" else "-"
            lin = f"{r['linearity']:.3f}" if r["linearity"] is not None else "-"
            out.append(f"| {model} | {r.get('gradient_mib', 0):.1f} | {backend} | {r['ranks']} | "
                       f"{r['samples_per_s']:.1f} | {lin} | {vs} | {r['runs']} |")
    return "\n".join(out) + "\n"


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_collective(plt, table: dict, folder: str) -> list[str]:
    written = []
    for (op, inplace), by_size in sorted(table.items()):
        sizes = sorted(s for s in by_size if s > 0)
        if not sizes:
            continue
        impls = sorted({i for cells in by_size.values() for i in cells}, key=_impl_key)
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for impl in impls:
            have = [s for s in sizes if impl in by_size[s]]
            left.plot(have, [by_size[s][impl]["time_us"] for s in have], marker="o", label=impl)
            right.plot(have, [by_size[s][impl]["busbw_gbps"] for s in have], marker="o", label=impl)
        left.set(xscale="log", yscale="log", xlabel="size (B)", ylabel="time (us)", title=f"{op}: latency")
        right.set(xscale="log", xlabel="size (B)", ylabel="busbw (GB/s)", title=f"{op}: bus bandwidth")
        for axis in (left, right):
            axis.set_xscale("log", base=2)
            axis.grid(True, which="both", alpha=0.3)
            axis.legend()
        fig.tight_layout()
        both_places = sum(1 for key in table if key[0] == op) > 1  # dlop-bench has in- and out-of-place rows
        path = os.path.join(folder, f"{op}{('_in' if inplace else '_out') if both_places else ''}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_ddp(plt, table: dict, folder: str) -> list[str]:
    models = list(table)
    backends = sorted({b for cells in table.values() for b in cells}, key=_impl_key)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(len(backends), 1)
    for k, backend in enumerate(backends):
        xs = [m + k * width for m in range(len(models))]
        left.bar(xs, [table[m].get(backend, {}).get("samples_per_s", 0) for m in models], width, label=backend)
        lin = [table[m].get(backend, {}).get("linearity") or 0 for m in models]
        right.bar(xs, lin, width, label=backend)
    for axis, label in ((left, "samples/s"), (right, "linearity")):
        axis.set_xticks([m + width * (len(backends) - 1) / 2 for m in range(len(models))], models)
        axis.set_ylabel(label)
        axis.legend()
    right.axhline(1.0, color="gray", lw=0.8)
    left.set_title("DDP throughput")
    right.set_title("linearity (N-rank / 1-rank / N)")
    fig.tight_layout()
    path = os.path.join(folder, "ddp.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dlop report", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="JSON files of bench.c10d, bench.ddp or dlop-bench")
    p.add_argument("--out", help="write the markdown here (default: stdout)")
    p.add_argument("--plots", help="write PNG plots into this folder")
    args = p.parse_args(argv)
    collective, ddp = [], []
    for path in args.files:
        _, rows = read_rows(path)
        (ddp if rows and "model" in rows[0] else collective).append(rows)
    parts, tables = [], {}
    if collective:
        tables["collective"] = merge_collective(collective)
        parts.append(collective_markdown(tables["collective"]))
    if ddp:
        tables["ddp"] = merge_ddp(ddp)
        parts.append(ddp_markdown(tables["ddp"]))
    text = "\n".join(parts)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text)
    else:
        print(text)
    if args.plots:
        plt = _pyplot()
        if plt is None:
            print("report: matplotlib is not installed; plots skipped (pip install matplotlib)", file=sys.stderr)
            return 0
        os.makedirs(args.plots, exist_ok=True)
        written = []
        if "collective" in tables:
            written += plot_collective(plt, tables["collective"], args.plots)
        if "ddp" in tables:
            written += plot_ddp(plt, tables["ddp"], args.plots)
        print("report: wrote " + ", ".join(written), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
