"""Hierarchical all-reduce against the flat ring across hosts on a shaped link.

Makes H hosts (network namespaces through a bridge, dlop.bench.netns; root
only), each link shaped to RATE (tbf) or RATE and DELAY (netem), and runs
``python -m dlop.bench.c10d --ops all_reduce`` on H x P ranks (rank r on host
r // P, as torchrun places them) with DLOP_ALGO=allreduce:ring, then
allreduce:hierarchical, then ring again ... (--runs pairs). Each ratio is
ring time / hierarchical time of one pair (adjacent launches), and the table
quotes medians over the pairs::

    python bench/multihost_allreduce.py --rate 1gbit --sizes 64K,1M,16M --runs 3 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dlop.bench import _common, netns

ALGOS = ("ring", "hierarchical")


def launch(hosts: netns.Hosts, per_host: int, algo: str, args, json_path: Path, port: int) -> None:
    world = len(hosts.names) * per_host
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_host),
                   MASTER_ADDR=hosts.addrs[0], MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   GLOO_SOCKET_IFNAME=hosts.device, DLOP_ALGO=f"allreduce:{algo}")
        env.pop("DLOP_HOST_ID", None)
        argv = [sys.executable, "-m", "dlop.bench.c10d", "--ops", "all_reduce", "--impls", "dlop", "--sizes",
                args.sizes, "-r", str(args.repetitions), "--json", str(json_path)]
        out = None if rank == 0 else subprocess.DEVNULL
        procs.append(hosts.popen(rank // per_host, argv, env=env, stdout=out))
    codes = [p.wait(timeout=args.timeout) for p in procs]
    if any(codes):
        raise SystemExit(f"{algo}: ranks exited with {codes}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--per-host", type=int, default=2)
    p.add_argument("--rate", default="1gbit", help="tc rate of each host's link, both directions")
    p.add_argument("--delay", help="one-way delay per link direction (needs netem)")
    p.add_argument("--sizes", default="64K,1M,16M")
    p.add_argument("--runs", type=int, default=3, help="ring/hierarchical pairs")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="dlop.bench.c10d repetitions per launch")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default="multihost-out", help="folder for each launch's JSON and the summary")
    args = p.parse_args(argv)
    ok, why = netns.available()
    if not ok:
        print(f"multihost_allreduce: {why}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, dict[int, list[float]]] = {a: {} for a in ALGOS}
    ratios: dict[int, list[float]] = {}
    port = 29600
    with netns.Hosts(args.hosts, args.rate, args.delay) as hosts:
        print(hosts.describe(), flush=True)
        for run in range(args.runs):
            this_run = {}
            for algo in ALGOS:
                path = out / f"run{run}-{algo}.json"
                port += 1
                start = time.monotonic()
                launch(hosts, args.per_host, algo, args, path, port)
                print(f"run {run} {algo}: {time.monotonic() - start:.1f} s", flush=True)
                rows = [r for r in _common.read_rows(str(path))[1] if r["op"] == "all_reduce"]
                if any(r["wrong"] for r in rows):
                    raise SystemExit(f"{algo}: wrong results in {path}")
                this_run[algo] = {r["bytes"]: r["time_us"] for r in rows}
                for size, t in this_run[algo].items():
                    times[algo].setdefault(size, []).append(t)
            for size in this_run["ring"]:
                ratios.setdefault(size, []).append(this_run["ring"][size] / this_run["hierarchical"][size])
    shape = f"{args.rate}" + (f", {args.delay}" if args.delay else "")
    lines = [f"all_reduce float32, {args.hosts} hosts x {args.per_host} ranks, links {shape}; "
             f"medians of {args.runs} ring/hierarchical pairs",
             "", "| size | ring (us) | hierarchical (us) | ring / hierarchical | per pair |", "|---:|---:|---:|---:|---|"]
    for size in sorted(ratios):
        lines.append(f"| {_common.format_size(size)} | {statistics.median(times['ring'][size]):.0f} | "
                     f"{statistics.median(times['hierarchical'][size]):.0f} | {statistics.median(ratios[size]):.2f} | "
                     + ", ".join(f"{r:.2f}" for r in ratios[size]) + " |")
    summary = "\n".join(lines)
    print(summary)
    (out / "summary.md").write_text(summary + "\n")
    (out / "summary.json").write_text(json.dumps({"times_us": times, "ratios": ratios, "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
