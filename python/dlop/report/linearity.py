"""The DDP linearity report again, from a run's measurements, under other cluster assumptions.

    dlop report linearity --from-json DIR/linearity.json --out DIR2 [--link-gbps 10,25,100 --latency-us 5
                          --ranks-per-host 8 --cores-per-rank 2 --intra-gbps G --net-cpu-ns NS --step-ms MS
                          --predict 16,32,...,1024]

The measurements (calibration of every term of the scaling model, and the
checks on namespace hosts) come from ``python -m bench.linearity --out DIR``
in a dlop source tree (docs/benchmarks.md), which writes the same report with
the options below. This re-fits nothing: it predicts again with the given
link, ranks per host and cores per rank, and writes linearity.md,
linearity.json, checks.png and predicted.png into --out.
"""

from __future__ import annotations

import argparse
import os
import sys

from dlop.report import linearity_report

PREDICT = "16,32,64,128,256,512,1024"


def positive_list(text: str, kind=int) -> list:
    values = [kind(x) for x in text.split(",") if x.strip()]
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"expected positive numbers, not {text!r}")
    return values


def add_prediction_arguments(p: argparse.ArgumentParser) -> None:
    """The predictions' assumptions: this command's options, and those of ``python -m bench.linearity``."""
    p.add_argument("--link-gbps", default="10,25,100", help="predictions: network links (Gbit/s)")
    p.add_argument("--latency-us", "--link-latency-us", dest="latency_us", type=float, default=5.0,
                   help="predictions: the network link's one-way latency")
    p.add_argument("--ranks-per-host", type=int, default=8, help="predictions: ranks per host")
    p.add_argument("--cores-per-rank", type=float, default=2.0,
                   help="predictions: cores each rank has (its compute threads and the backend's)")
    p.add_argument("--intra-gbps", type=float,
                   help="predictions: the intra-host link (default: dlop's, as calibrated on this host)")
    p.add_argument("--net-cpu-ns", type=float,
                   help="predictions: CPU per byte a rank sends across hosts (default: dlop's, as calibrated here)")
    p.add_argument("--step-ms", type=float, help="predictions: also a GPU column, this GPU step time of the model")
    p.add_argument("--predict", default=PREDICT, help="predictions: rank counts")


def check_prediction_arguments(p: argparse.ArgumentParser, args) -> None:
    """Parses the lists in place; a bad value is a usage error that names it."""
    try:
        args.predict = positive_list(args.predict)
        args.link_gbps = positive_list(args.link_gbps, float)
        positive_list(f"{args.ranks_per_host},{args.cores_per_rank},{args.step_ms or 1},{args.intra_gbps or 1}",
                      float)
        if args.net_cpu_ns is not None and args.net_cpu_ns < 0:
            raise ValueError(f"--net-cpu-ns must be 0 or more, not {args.net_cpu_ns:g}")
    except ValueError as e:
        p.error(str(e))


def write(header: dict, measurements: dict, args) -> list[str]:
    """The report of these measurements under args' assumptions, written into args.out; the paths written."""
    settings = linearity_report.Settings(
        link_gbps=args.link_gbps, latency_us=args.latency_us, ranks_per_host=args.ranks_per_host,
        cores_per_rank=args.cores_per_rank, predict=args.predict, step_ms=args.step_ms, intra_gbps=args.intra_gbps,
        net_cpu_ns=args.net_cpu_ns, bucket_bytes=header.get("bucket_cap_mb", 25.0) * 2**20)
    report = linearity_report.build(header, measurements, settings)
    written = linearity_report.write(report, args.out)
    print(f"linearity: wrote {', '.join(written)}", file=sys.stderr)
    return written


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="dlop report linearity", description=__doc__.split("\n\n")[0])
    p.add_argument("--from-json", required=True,
                   help="a linearity.json (python -m bench.linearity writes one with its measurements)")
    p.add_argument("--out", required=True, help="folder for the report, its JSON and PNGs (created)")
    add_prediction_arguments(p)
    args = p.parse_args(argv)
    check_prediction_arguments(p, args)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    header, measurements = linearity_report.read_measured(args.from_json)
    os.makedirs(args.out, exist_ok=True)
    write(header, measurements, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
