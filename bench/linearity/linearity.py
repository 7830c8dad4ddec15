"""DDP linearity beyond this machine: a scaling model calibrated from its parts, checked on multi-host runs.

    python -m bench.linearity --out DIR                              # calibrate, check, predict (~15 min)
    python -m bench.linearity --layouts 2x1 --rates 1gbit --runs 1 --sizes 1M --batch 2 --steps 1 -r 1 --out DIR
                                                                     # a small check (under a minute)
    dlop report linearity --from-json DIR/linearity.json --link-gbps 100 --ranks-per-host 4 --out DIR2
                                                                     # the same measurements, other assumptions

Calibration (this host, one benchmark per term; dlop/report/scaling_model.py):
dlop's intra-host link from ``dlop-bench allreduce --local 2``, Gloo's from
its 2-rank all-reduce, the network from ``dlop-bench p2p`` between namespace
hosts, each backend's CPU per byte on this host and across two hosts from
2-rank all-reduces through torch, compute and backward's share from the
model alone, DDP's overhead and the backend's CPU per step from 1- and
2-rank ``bench.ddp`` runs.
Checks (out of sample): per --rates link and --layouts HxP (H namespace
hosts, P ranks each, tbf-shaped), all-reduce times of dlop's ring and
hierarchical algorithms and Gloo's, and DDP's linearity. Each is measured
--runs times, rounds interleaved; the report quotes medians and each term's
spread. Predictions for 16-1024 ranks state their assumed link, ranks per
host and cores per rank; --step-ms adds a GPU column (a GPU's step time).
Writes linearity.md, linearity.json (the same numbers), checks.png,
predicted.png and raw/ (every benchmark's own output).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench.common import _common
from bench.linearity import linearity_calibrate as cal, linearity_checks as checks
from bench.ddp.ddp_models import MODELS
from dlop.report import linearity as report
from dlop.report.linearity_terms import ddp_terms

RETRY_PAUSE_S = 30


def _layout(text: str) -> tuple[int, int]:
    hosts, sep, per_host = text.strip().lower().partition("x")
    if not sep or not hosts.isdigit() or not per_host.isdigit() or int(hosts) < 2 or int(per_host) < 1:
        raise ValueError(f"a layout is HOSTSxRANKS_PER_HOST with at least 2 hosts, e.g. 2x1, not {text!r}")
    return int(hosts), int(per_host)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.linearity", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the report, its JSON and PNGs (created)")
    p.add_argument("--models", default="transformer", help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--layouts", default="2x1,2x2,3x1", help="HOSTSxRANKS_PER_HOST on namespace hosts, to check")
    p.add_argument("--rates", default="1gbit,10gbit", help="tc rates of the hosts' links (none: unshaped)")
    p.add_argument("--sizes", default="1M,16M", help="all-reduce sizes checked across hosts")
    p.add_argument("--runs", type=int, default=3, help="rounds of every measurement (the spread's sample)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank, everywhere")
    p.add_argument("--steps", type=int, default=3, help="DDP: timed steps per repetition")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("-r", "--repetitions", type=int, default=2, help="DDP, all-reduce and p2p repetitions per run")
    p.add_argument("--batch", type=int, default=0, help="samples per rank and step (0: the model's default)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    report.add_prediction_arguments(p)
    args = p.parse_args(argv)
    try:
        args.layouts = [_layout(x) for x in args.layouts.split(",") if x.strip()]
        report.positive_list(f"{args.runs},{args.threads}")
    except ValueError as e:
        p.error(str(e))
    report.check_prediction_arguments(p, args)
    args.rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if unknown := [m for m in args.models if m not in MODELS]:
        p.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(MODELS)}")
    return args


def ddp_args(args) -> list[str]:
    """`python -m bench.ddp`'s arguments, as calibration and checks both run it."""
    argv = ["--models", ",".join(args.models), "--backends", "dlop,gloo",
            "--threads", str(args.threads), "--steps", str(args.steps), "--warmup", str(args.warmup), "-r",
            str(args.repetitions), "--bucket-cap-mb", str(args.bucket_cap_mb), "--no-progress"]
    return argv + (["--batch", str(args.batch)] if args.batch else [])


def _once_more(step, *args):
    """step(*args), and once more after a pause if it fails: on a machine shared with builds, a launch can meet the
    library while it is being relinked. A second failure is the run's."""
    try:
        return step(*args)
    except RuntimeError as e:
        print(f"linearity: {e}; trying once more in {RETRY_PAUSE_S} s", file=sys.stderr, flush=True)
        time.sleep(RETRY_PAUSE_S)
        return step(*args)


def measure(args) -> dict:
    """Every run's calibration and checks, rounds interleaved so that a noisy neighbour hits all alike."""
    from bench.common import forked, netns
    from bench.ddp.ddp import free_port

    ok, why = netns.available()
    if not ok:
        raise SystemExit(f"the multi-host checks need network-namespace hosts, which cannot be made here: {why}")
    forked.preload()  # every benchmark below runs forked from here, torch already imported
    raw = Path(args.out) / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    found = {"calibration": [], "allreduce": [], "ddp": []}
    port = 29700
    for run in range(args.runs):
        print(f"linearity: run {run + 1} of {args.runs}: calibration", file=sys.stderr, flush=True)
        one = _once_more(cal.ddp_local, ddp_args(args), 1, raw, str(run))
        two = _once_more(cal.ddp_local, ddp_args(args), 2, raw, str(run))
        through_torch = _once_more(cal.intra_c10d, raw, str(run), free_port())
        cpu = through_torch["cpu_ns_per_byte"]
        crowded = _once_more(cal.crowded_c10d, raw, str(run), free_port(), _common.cpu_count(), args.repetitions)
        found["calibration"].append({
            "run": run,
            "intra": {"dlop": dict(_once_more(cal.intra_dlop, raw, str(run)), cpu_ns_per_byte=cpu["dlop"]),
                      "gloo": dict(through_torch["gloo"], cpu_ns_per_byte=cpu["gloo"])},
            # Forked too: this process must not start torch's thread pool (forked.py says why).
            "split": {m: forked.call(cal.split, m, args.batch, args.threads, args.steps + 2) for m in args.models},
            "ddp": {m: ddp_terms(one, two, m) for m in args.models}, "net": {}, "crowded": crowded})
        for rate in args.rates:
            shaped = None if rate == "none" else rate
            with netns.Hosts(max(h for h, _ in args.layouts), shaped) as hosts:
                port += 1
                net = _once_more(cal.network, hosts, raw, f"{rate}_{run}", port, args.repetitions)
                port += 1
                net["cpu_ns_per_byte"] = _once_more(cal.network_cpu, hosts, raw, f"{rate}_{run}", port,
                                                    args.repetitions)
                found["calibration"][-1]["net"][rate] = net
                for n_hosts, per_host in args.layouts:
                    where = {"run": run, "rate": rate, "hosts": n_hosts, "per_host": per_host}
                    print(f"linearity: run {run + 1}: {n_hosts}x{per_host} on {rate}", file=sys.stderr, flush=True)
                    # Hierarchical declines one rank per host (nothing to fold in before crossing hosts).
                    for algorithm in ("ring", "hierarchical") if per_host > 1 else ("ring",):
                        port += 1
                        tag = f"{rate}_{n_hosts}x{per_host}_{algorithm}_{run}"
                        for row in _once_more(checks.allreduce, hosts, n_hosts, per_host, algorithm, args.sizes,
                                              args.repetitions, raw, tag, port):
                            column = algorithm if row["impl"] == "dlop" else "gloo"
                            found["allreduce"].append(dict(where, column=column, bytes=row["bytes"],
                                                           time_us=row["time_us"]))
                    port += 1
                    for row in _once_more(checks.ddp, hosts, n_hosts, per_host, ddp_args(args), raw,
                                          f"{rate}_{n_hosts}x{per_host}_{run}", port):
                        if row["backend"] != "none":
                            found["ddp"].append(dict(where, **row))
    return found


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    header = _common.run_header(benchmark="linearity", threads_per_rank=args.threads, steps=args.steps,
                                warmup=args.warmup, repetitions=args.repetitions, runs=args.runs,
                                layouts=[f"{h}x{p}" for h, p in args.layouts], rates=args.rates,
                                sizes=args.sizes, batch=args.batch, bucket_cap_mb=args.bucket_cap_mb,
                                models=args.models)
    report.write(header, measure(args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
