"""DDP linearity across rank counts: measured on this machine, modelled beyond it.

    python -m dlop.bench.linearity --ranks 1,2,4 --models transformer --out DIR
    dlop report linearity --ranks 1,2,4 --hosts 2 --out DIR      # ranks in network namespaces
    dlop report linearity --from-json DIR/linearity.json --out DIR2  # report again from recorded runs

Runs ``dlop.bench.ddp`` once per rank count N (its models, its launching),
every backend in the same run, with the same torch threads per rank at every
N, so that the 1-rank run (the model alone, no DDP) is what one rank of any
run would do without communication. Writes into --out: linearity.md (tables),
linearity.json (the same numbers), throughput.png, linearity.png and
speedup_scatter.png, plus each run's own JSON and output under raw/.
linearity = N-rank throughput / 1-rank throughput / N. The scaling model
(dlop/bench/scaling_model.py) is calibrated on these runs and predicts 16 to
1024 ranks over the given network links.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time

from dlop.bench import _common, linearity_report
from dlop.bench.ddp_models import MODELS

PEERS = ("gloo",)
RUN_TIMEOUT_S = 1800


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m dlop.bench.linearity", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the report, its JSON and PNGs (created)")
    p.add_argument("--ranks", default="1,2,4", help="rank counts to measure (1 is added: it is the baseline)")
    p.add_argument("--models", default="transformer", help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--backends", default=None,
                   help="comma-separated, dlop first (default dlop,gloo; nccl is not measured: ddp trains on CPU)")
    p.add_argument("--hosts", type=int, default=0,
                   help="spread ranks over this many network-namespace hosts (rank r on host r %% H; needs root)")
    p.add_argument("--host-rate", help="the hosts' link rate for tc, e.g. 10gbit (default: unshaped)")
    p.add_argument("--host-delay", help="the hosts' link delay for tc, e.g. 50us")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank, the same at every N")
    p.add_argument("--steps", type=int, default=4, help="timed steps per repetition")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("--batch", type=int, default=0, help="samples per rank and step (0: the model's default)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--link-gbps", default="10,25,100", help="network links to predict for (Gbit/s)")
    p.add_argument("--link-latency-us", type=float, default=5.0, help="the network link's latency (one hop)")
    p.add_argument("--intra-latency-us", type=float, default=2.0, help="the intra-host link's latency (one hop)")
    p.add_argument("--intra-gbps", type=float, help="the intra-host link in the predictions (default: as fitted)")
    p.add_argument("--ranks-per-host", type=int, default=8, help="ranks per host in the predictions")
    p.add_argument("--predict", default="16,32,64,128,256,512,1024", help="rank counts to predict")
    p.add_argument("--from-json", help="no runs: report again from this linearity.json's measurements")
    args = p.parse_args(argv)
    try:
        args.ranks = sorted({1, *(_positive(x) for x in args.ranks.split(","))})
        args.predict = [_positive(x) for x in args.predict.split(",")]
        args.link_gbps = [float(x) for x in args.link_gbps.split(",")]
    except ValueError as e:
        p.error(str(e))
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if unknown := [m for m in args.models if m not in MODELS]:
        p.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(MODELS)}")
    args.backends = [b.strip() for b in (args.backends or "dlop,gloo").split(",") if b.strip()]
    if args.backends[0] != "dlop" or any(b not in ("dlop", *PEERS) for b in args.backends):
        p.error(f"--backends must start with dlop and name only peers {', '.join(PEERS)}")
    if args.hosts < 0 or args.threads < 1 or any(g <= 0 for g in args.link_gbps):
        p.error("--hosts must be >= 0, --threads >= 1 and --link-gbps positive")
    return args


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"rank counts must be positive, not {value}")
    return value


def ddp_argv(args, json_path: str) -> list[str]:
    argv = [sys.executable, "-m", "dlop.bench.ddp", "--models", ",".join(args.models), "--backends",
            ",".join(args.backends), "--threads", str(args.threads), "--steps", str(args.steps), "--warmup",
            str(args.warmup), "-r", str(args.repetitions), "--bucket-cap-mb", str(args.bucket_cap_mb), "--json",
            json_path, "--no-progress"]
    return argv + (["--batch", str(args.batch)] if args.batch else [])


def run_local(args, ranks: int, json_path: str, log) -> None:
    done = subprocess.run([*ddp_argv(args, json_path), "--ranks", str(ranks)], stdout=log, stderr=subprocess.STDOUT,
                          timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"dlop.bench.ddp with {ranks} ranks failed (exit {done.returncode}); see {log.name}")


def netns_module(args):
    """dlop.bench.netns, or a clear error when --hosts cannot work here (checked before any run)."""
    try:
        from dlop.bench import netns
    except ImportError as e:
        raise SystemExit(f"--hosts needs dlop.bench.netns (network-namespace hosts), which this dlop lacks: {e}")
    ok, why = netns.available()
    if not ok:
        raise SystemExit(f"--hosts {args.hosts}: network namespaces cannot be made here: {why}")
    return netns


def run_on_hosts(args, hosts, ranks: int, json_path: str, log) -> None:
    from dlop.bench.ddp import free_port, rank_env

    port = free_port()
    procs = []
    try:
        from dlop.bench import netns

        for r in range(ranks):
            # Gloo binds to the address the hostname resolves to (loopback) unless told the host's device.
            env = dict(os.environ, GLOO_SOCKET_IFNAME=netns.DEVICE,
                       **rank_env(r, ranks, r // args.hosts, hosts.addrs[0], port))
            procs.append(hosts.popen(r % args.hosts, ddp_argv(args, json_path), env=env, stdout=log,
                                     stderr=subprocess.STDOUT))
        # One failed rank leaves the others waiting on it: stop at the first failure.
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        codes = [p.poll() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(c != 0 for c in codes):  # None: still running at the deadline, then killed
        raise RuntimeError(f"dlop.bench.ddp with {ranks} ranks on {args.hosts} hosts failed (exits {codes}); "
                           f"see {log.name}")


def measure(args) -> list[dict]:
    """Runs ddp at every N; returns its rows, each with "hosts" and "threads_per_rank" added."""
    raw = os.path.join(args.out, "raw")
    os.makedirs(raw, exist_ok=True)
    rows = []
    if args.hosts:
        netns = netns_module(args)
        hosts_context = netns.Hosts(args.hosts, rate=args.host_rate, delay=args.host_delay)
    else:
        hosts_context = contextlib.nullcontext()
    with hosts_context:
        hosts = hosts_context if args.hosts else None
        bar = _common.progress(args.ranks, desc="linearity", unit="run")
        for ranks in bar:
            bar.set_postfix_str(f"{ranks} ranks")
            json_path = os.path.join(raw, f"ddp_{ranks}.json")
            with open(os.path.join(raw, f"ddp_{ranks}.txt"), "w") as log:
                if hosts is not None:
                    run_on_hosts(args, hosts, ranks, json_path, log)
                else:
                    run_local(args, ranks, json_path, log)
            _, run_rows = _common.read_rows(json_path)
            for row in run_rows:
                if row["backend"] == "none" and ranks > 1:
                    continue  # each run's own model-alone row; the 1-rank run's is the baseline
                rows.append(dict(row, hosts=max(args.hosts, 1), threads_per_rank=args.threads))
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.from_json:
        header, measured = linearity_report.read_measured(args.from_json)
    else:
        if args.hosts:
            netns_module(args)  # fail before minutes of runs, not after
        header = _common.run_header(benchmark="linearity", threads_per_rank=args.threads, steps=args.steps,
                                    warmup=args.warmup, repetitions=args.repetitions, hosts=max(args.hosts, 1),
                                    host_rate=args.host_rate, host_delay=args.host_delay,
                                    bucket_cap_mb=args.bucket_cap_mb, models=args.models, backends=args.backends)
        measured = measure(args)
    settings = linearity_report.ModelSettings(
        link_gbps=args.link_gbps, link_latency_us=args.link_latency_us, intra_latency_us=args.intra_latency_us,
        ranks_per_host=args.ranks_per_host, predict=args.predict, intra_gbps=args.intra_gbps,
        bucket_bytes=header.get("bucket_cap_mb", args.bucket_cap_mb) * 2**20)
    report = linearity_report.build(header, measured, settings)
    written = linearity_report.write(report, args.out)
    print(f"linearity: wrote {', '.join(written)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
