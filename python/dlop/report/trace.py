"""DLOP_TRACE files as one table: per process, operation and size, how long operations waited and ran.

    dlop report trace DIR [--json FILE]          (python -m dlop.report.trace)

DIR holds the ``dlop-trace-<host>-<pid>.json`` files a run with
``DLOP_TRACE=DIR`` wrote. Per process and per (operation, bytes): the count,
then the median, 90th percentile and largest of ``queued`` (from the call to
the start: behind earlier operations, or waiting for a device's copy of the
inputs) and of ``ran`` (from the start to the end). A staged accelerator call
that ran quickly but waited long says that its copies out came late; one that
ran long says that its host operation was slow where it ran.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from dlop.report.common import format_size, percentile


def read_ops(folder: Path) -> dict[str, list[dict]]:
    """{trace file name: its collectives and p2p operations (chunk events left out)}."""
    files = sorted(folder.glob("dlop-trace-*.json"))
    if not files:
        raise SystemExit(f"dlop report trace: no dlop-trace-*.json in {folder} (run with DLOP_TRACE={folder})")
    found = {}
    for path in files:
        try:
            events = json.loads(path.read_text())["traceEvents"]
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"dlop report trace: {path} is not a DLOP_TRACE file: {e}") from e
        found[path.name] = [e for e in events if "queued_us" in e.get("args", {})]
    return found


def summarise(ops: list[dict]) -> list[dict]:
    """One row per (operation, bytes): count and the spread of queued and ran, in microseconds."""
    groups = defaultdict(list)
    for e in ops:
        groups[(e["name"], e["args"]["bytes"])].append(e)
    rows = []
    for (name, size), events in sorted(groups.items()):
        queued = [float(e["args"]["queued_us"]) for e in events]
        ran = [float(e["dur"]) for e in events]
        row = {"op": name, "bytes": size, "count": len(events)}
        for key, values in (("queued", queued), ("ran", ran)):
            row.update({f"{key}_p50_us": percentile(values, 0.5), f"{key}_p90_us": percentile(values, 0.9),
                        f"{key}_max_us": max(values)})
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'op':>14} {'bytes':>9} {'count':>6} | {'queued p50':>10} {'p90':>9} {'max':>9} | " \
           f"{'ran p50':>9} {'p90':>9} {'max':>9}   (us)"
    lines = [head]
    for r in rows:
        lines.append(f"{r['op']:>14} {format_size(r['bytes']) if r['bytes'] else '0':>9} {r['count']:>6} | "
                     f"{r['queued_p50_us']:>10.0f} {r['queued_p90_us']:>9.0f} {r['queued_max_us']:>9.0f} | "
                     f"{r['ran_p50_us']:>9.0f} {r['ran_p90_us']:>9.0f} {r['ran_max_us']:>9.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dlop report trace", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="the DLOP_TRACE folder")
    p.add_argument("--json", help="also write {file: rows} to this file")
    args = p.parse_args(argv)
    summary = {name: summarise(ops) for name, ops in read_ops(args.folder).items()}
    for name, rows in summary.items():
        print(f"# {name}")
        print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
