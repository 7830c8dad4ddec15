"""dlop all-reduce across hosts on a shaped link: algorithms against each other and Gloo.

Makes H hosts (network namespaces through a bridge, bench.netns; root
only), each link shaped to RATE (tbf) or RATE and DELAY (netem), or unshaped
(``--rate none``), and runs ``python -m bench.c10d --ops all_reduce`` on
H x P ranks (rank r on host r // P, as torchrun places them) once per
algorithm of ``--algos`` (DLOP_ALGO=allreduce:<algo>; ``auto``: dlop's own
choice) and per ``--variant`` (the same algorithms again with more environment
variables, e.g. UCX settings), round-robin, ``--runs`` rounds. With ``--gloo``
every launch also times Gloo on the same tensors, repetitions alternating with
dlop's. Ratios are taken within a round (first column / each other, adjacent
launches) or within a launch (column / Gloo), and the table quotes their
medians over the rounds::

    python -m bench.multihost_allreduce --rate 1gbit --sizes 64K,1M,16M --runs 3 --out DIR
    python -m bench.multihost_allreduce --per-host 1 --algos auto --gloo --sizes 1M,16M,64M \
        --variant rndv:UCX_RNDV_SEND_NBR_THRESH=19522,UCX_TCP_TX_SEG_SIZE=8k --out DIR
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

from bench.common import _common, netns


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """LABEL:VAR=VALUE[,VAR=VALUE...] -> (label, {VAR: VALUE})."""
    label, _, assignments = text.partition(":")
    pairs = [a.partition("=") for a in assignments.split(",") if a]
    if not label or not pairs or any(not name or not sep for name, sep, _ in pairs):
        raise argparse.ArgumentTypeError(f"not LABEL:VAR=VALUE[,VAR=VALUE]: {text!r}")
    return label, {name: value for name, _, value in pairs}


def launch(hosts: netns.Hosts, per_host: int, algo: str, args, json_path: Path, port: int,
           extra_env: dict[str, str]) -> None:
    world = len(hosts.names) * per_host
    impls = "dlop,gloo" if args.gloo else "dlop"
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_host),
                   MASTER_ADDR=hosts.addrs[0], MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   GLOO_SOCKET_IFNAME=hosts.device, **extra_env)
        if algo != "auto":
            env["DLOP_ALGO"] = f"allreduce:{algo}"
        env.pop("DLOP_HOST_ID", None)
        argv = [sys.executable, "-m", "bench.c10d", "--ops", "all_reduce", "--impls", impls, "--sizes",
                args.sizes, "-r", str(args.repetitions), "--json", str(json_path)]
        out = None if rank == 0 else subprocess.DEVNULL
        procs.append(hosts.popen(rank // per_host, argv, env=env, stdout=out))
    codes = [p.wait(timeout=args.timeout) for p in procs]
    if any(codes):
        raise SystemExit(f"{algo}: ranks exited with {codes}")


def _median(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f}" if values else "-"


def summarize(args, launched: list[str], times: dict, ratios: dict) -> str:
    """The markdown table: median times per column, then median ratios (with each round's)."""
    shape = "unshaped" if args.rate == "none" else f"{args.rate}" + (f", {args.delay}" if args.delay else "")
    columns = launched + (["gloo"] if args.gloo else [])
    variants = "".join(f"; @{label}: " + " ".join(f"{k}={v}" for k, v in env.items()) for label, env in args.variant)
    lines = [f"all_reduce float32, {args.hosts} hosts x {args.per_host} ranks, links {shape}; "
             f"medians of {args.runs} rounds (each a launch per column){variants}", "",
             "| size | " + " | ".join(f"{c} (us)" for c in columns) + " | " + " | ".join(ratios) + " |",
             "|---:|" + "---:|" * len(columns) + "---|" * len(ratios)]
    for size in sorted(times[launched[0]]):
        cells = [_median(times[c].get(size, []), 0) for c in columns]
        cells += [f"{_median(per[size], 2)} ({', '.join(f'{r:.2f}' for r in per[size])})" for per in ratios.values()]
        lines.append(f"| {_common.format_size(size)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--per-host", type=int, default=2)
    p.add_argument("--rate", default="1gbit", help="tc rate of each host's link, both directions; none: unshaped")
    p.add_argument("--delay", help="one-way delay per link direction (needs netem)")
    p.add_argument("--sizes", default="64K,1M,16M")
    p.add_argument("--algos", default="ring,hierarchical",
                   help="comma-separated all-reduce algorithms to force, or auto (dlop's choice)")
    p.add_argument("--variant", action="append", default=[], type=parse_variant, metavar="LABEL:VAR=V[,VAR=V]",
                   help="also run every algorithm with these environment variables (column ALGO@LABEL); repeatable")
    p.add_argument("--gloo", action="store_true", help="also time Gloo in every launch (ratios algorithm / gloo)")
    p.add_argument("--runs", type=int, default=3, help="rounds (one launch per algorithm each)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="bench.c10d repetitions per launch")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default="multihost-out", help="folder for each launch's JSON and the summary")
    args = p.parse_args(argv)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    if not algos or len(set(algos)) != len(algos):
        p.error(f"--algos needs distinct algorithm names, not {args.algos!r}")
    labels = [label for label, _ in args.variant]
    if len(set(labels)) != len(labels):
        p.error(f"--variant labels must differ: {', '.join(labels)}")
    launches = [(algo, algo, {}) for algo in algos]
    launches += [(f"{algo}@{label}", algo, env) for label, env in args.variant for algo in algos]
    columns = [name for name, _, _ in launches]
    if args.rate == "none" and args.delay:
        p.error("--delay needs a --rate (netem shapes both)")
    ok, why = netns.available()
    if not ok:
        print(f"multihost_allreduce: {why}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, dict[int, list[float]]] = {c: {} for c in columns + ["gloo"]}
    ratios: dict[str, dict[int, list[float]]] = {f"{columns[0]} / {c}": {} for c in columns[1:]}
    if args.gloo:
        ratios.update({f"{c} / gloo": {} for c in columns})
    port = 29600
    rate = None if args.rate == "none" else args.rate
    with netns.Hosts(args.hosts, rate, args.delay) as hosts:
        print(hosts.describe(), flush=True)
        for run in range(args.runs):
            this_run: dict[str, dict[int, float]] = {}
            for name, algo, env in launches:
                path = out / f"run{run}-{name}.json"
                port += 1
                start = time.monotonic()
                launch(hosts, args.per_host, algo, args, path, port, env)
                print(f"run {run} {name}: {time.monotonic() - start:.1f} s", flush=True)
                rows = [r for r in _common.read_rows(str(path))[1] if r["op"] == "all_reduce"]
                if any(r["wrong"] for r in rows):
                    raise SystemExit(f"{name}: wrong results in {path}")
                this_run[name] = {r["bytes"]: r["time_us"] for r in rows if r["impl"] == "dlop"}
                gloo = {r["bytes"]: r["time_us"] for r in rows if r["impl"] == "gloo"}
                for size, t in this_run[name].items():
                    times[name].setdefault(size, []).append(t)
                    if size in gloo:
                        times["gloo"].setdefault(size, []).append(gloo[size])
                        ratios[f"{name} / gloo"].setdefault(size, []).append(t / gloo[size])
            for other in columns[1:]:
                for size, t in this_run[columns[0]].items():
                    ratios[f"{columns[0]} / {other}"].setdefault(size, []).append(t / this_run[other][size])
    summary = summarize(args, columns, times, ratios)
    print(summary)
    (out / "summary.md").write_text(summary + "\n")
    (out / "summary.json").write_text(json.dumps({"times_us": times, "ratios": ratios, "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
