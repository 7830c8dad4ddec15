"""dlop offloader-stats HOST:PORT --token-file F [--json]: what a running
dlop-offloader has done, per stage (read, decode, augment, collate: samples;
batch, send: batches) with its rate per thread, and its counters.

read's bytes are the samples' encoded bytes (a file's size), decode's what
they decoded to. On the generic Python path the Dataset's work is one step:
read counts the bytes its workers read, untimed ("-" for the rates), and
decode, augment and collate stay at 0."""

from __future__ import annotations

import argparse
import json
import sys


def table(stats: dict) -> str:
    lines = [f"{'stage':>8} {'items':>10} {'seconds':>10} {'items/s':>10} {'MB/s':>9}"]
    for s in stats["stages"]:
        if s["seconds"] > 0:
            rate, mbps = f"{s['items'] / s['seconds']:.1f}", f"{s['bytes'] / s['seconds'] / 1e6:.1f}"
        else:  # nothing through it yet (0.0), or counted but not timed (-)
            rate = mbps = "-" if s["items"] else "0.0"
        lines.append(f"{s['name']:>8} {s['items']:>10} {s['seconds']:>10.3f} {rate:>10} {mbps:>9}")
    lines.append("  ".join(f"{k}={v}" for k, v in stats["counters"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dlop offloader-stats", description=__doc__)
    p.add_argument("address", help="HOST:PORT of the dlop-offloader")
    p.add_argument("--token-file", required=True, help="the file holding the shared token")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the daemon (default 10)")
    p.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = p.parse_args(argv)
    from dlop._C import offload
    from dlop.data.offload_loader import _split
    from dlop.errors import Error

    host, port = _split(args.address)
    with open(args.token_file, encoding="utf-8") as f:
        token = f.read().rstrip(" \t\n\r\v\f")  # as dlop-offloader reads it
    try:
        stats = offload.daemon_stats(host, port, token, args.timeout)
    except Error as e:
        print(f"dlop offloader-stats: {e}", file=sys.stderr)
        return 1
    print(json.dumps(stats, indent=1) if args.json else table(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
