#!/usr/bin/env python3
"""The headline's rows, one `python -m bench.train --device DEV --rows ROW` at a time (scripts/gpu_headline.sh).

    scripts/gpu_rows.py order [ROW...]                  the rows (bench.train's) in the order they run, headline first
    scripts/gpu_rows.py data BENCH_TRAIN_OPTIONS...     make the built-in data those options name, once
    scripts/gpu_rows.py merge --json OUT --report DIR [--skipped ROW=WHY]... ROW_JSON...

Each row runs in a bench.train invocation of its own, so that the script can
check the clock between rows and skip the rest where time runs short; `merge`
makes of them the one table bench.train writes for all rows (its header from
the first, the ratios and targets over every row), with each row's command and
the rows skipped, and why, in the header.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, from the repository root

# The headline's comparisons first: a visit cut short still has the device's ceiling, stock and dlop.
PRIORITY = ("synthetic", "stock", "dlop_offload", "stock_all_cores", "stock_uint8", "native_local", "gpu_decode",
            "dlop_run")


def order(rows: list[str]) -> list[str]:
    return sorted(rows, key=lambda r: PRIORITY.index(r) if r in PRIORITY else len(PRIORITY))


def merge(paths: list[str], skipped: dict[str, str]) -> tuple[dict, list[dict]]:
    from bench.train import train_device_report as report

    header, rows, commands, absent, workers, skipped = None, [], {}, {}, {}, dict(skipped)
    for path in paths:
        doc = json.loads(Path(path).read_text())
        header = header or dict(doc["header"])
        absent.update(doc["header"].get("absent", {}))
        skipped.update(doc["header"].get("skipped", {}))
        if isinstance(doc["header"].get("workers"), dict):
            workers.update(doc["header"]["workers"])
        for row in doc["rows"]:
            rows.append(row)
            commands[row["row"]] = doc["header"].get("command")
    if header is None:
        raise SystemExit("merge: no row ran")
    from bench.train.train_device import ROWS

    rows.sort(key=lambda r: ROWS.index(r["row"]) if r["row"] in ROWS else len(ROWS))  # bench.train's order
    header.update(absent=absent, row_commands=commands, skipped=skipped, ratios=report.ratios(rows),
                  targets=report.targets(header["kind"], rows),
                  offloader_cores_to_feed_device=report.cores_to_feed(rows))
    if workers:
        header["workers"] = workers
    if hasattr(report, "attribution"):  # where dlop_offload's gain over stock comes from, over every row
        header["attribution"] = report.attribution(rows)
    header.pop("command", None)
    return header, rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["order"]:
        if len(argv) == 1:
            from bench.train.train_device import ROWS

            argv = ["order", *ROWS]
        print(" ".join(order(argv[1:])))
        return 0
    if argv[:1] == ["data"]:
        from bench.train.train_device import parse_args
        from bench.train.train_device_datasets import builtin

        args = parse_args(argv[1:])
        print(args.data or builtin(args))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("merge",))
    p.add_argument("--json", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--skipped", action="append", default=[], metavar="ROW=WHY")
    p.add_argument("rows", nargs="*", metavar="ROW_JSON")
    args = p.parse_intermixed_args(argv)
    from bench.common import _common
    from bench.train import train_device_report as report

    skipped = dict(s.split("=", 1) for s in args.skipped)
    header, rows = merge(args.rows, skipped)
    report.print_table(rows, header)
    _common.write_json(args.json, header, rows)
    report.write(header, rows, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
