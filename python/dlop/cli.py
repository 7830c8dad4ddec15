"""The `dlop` command: one entry for dlop's tools.

    dlop make-dataset OUT [--kind image|video|audio --classes N --per-class N --seed S --jobs N]
                          [--size WxH --quality Q]  [--seconds S --fps F --codec h264 --gop-seconds MIN,MAX]
    dlop pack ROOT OUT.dlrec [--kind image|video|audio]
    dlop run [--local-offloaders N | --offloaders HOST:PORT[,...] | --offloaders-dns NAME:PORT[,...] | --discover]
             [--token-file F] [--wait S] [--strict] -- COMMAND...   (in a SLURM het job: no flags)
    dlop run --offloaders auto [--scaler local|slurm|kubernetes] [--min N --max N ...] -- COMMAND...
    dlop offloader --store HOST:PORT --token-file F [dlop-offloader args...]
    dlop offloader [dlop-offloader args...]                  (in het group 1 of a SLURM job)
    dlop slurm-template > job.sbatch                         (then: sbatch job.sbatch python train.py)
    dlop offloader-stats HOST:PORT --token-file F [--json]
    dlop report linearity --from-json linearity.json --out DIR [--link-gbps 25 --ranks-per-host 8 ...]
    dlop report trace DIR                                    (a DLOP_TRACE folder: how long ops waited and ran)
    dlop report FILE.json... [--plots DIR] [--out FILE.md]
    dlop --version

Each sub-command is a module with its own main (python -m dlop.data.make_dataset
works the same); this only dispatches, so a tool's options live in one place.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "make-dataset": ("dlop.data.make_dataset", "generate a built-in synthetic dataset: images (default), video or audio"),
    "pack": ("dlop.data.pack", "pack a folder by class or a manifest into a dlop record file"),
    "run": ("dlop.fleet.run", "run an unmodified training command with its DataLoaders offloaded"),
    "offloader": ("dlop.fleet.launcher", "run dlop-offloader for a job: in its c10d store, or in SLURM het group 1"),
    "slurm-template": ("dlop.fleet.slurm_template", "print a SLURM batch script: training in het group 0, offloaders in 1"),
    "offloader-stats": ("dlop.fleet.stats", "a running dlop-offloader's per-stage throughput and counters"),
    "report": ("dlop.report.tables", "benchmark JSON as tables and plots; `report linearity`: the DDP linearity "
               "report from its measurements; `report trace DIR`: a DLOP_TRACE folder's waits and run times"),
}

# `dlop report NAME ...`: reports of their own; anything else is benchmark JSON for dlop.report.tables.
REPORTS = {
    "linearity": ("dlop.report.linearity", "the DDP linearity report from bench.linearity's measurements"),
    "trace": ("dlop.report.trace", "a DLOP_TRACE folder: how long each operation waited and ran"),
}


def _usage() -> str:
    lines = ["usage: dlop COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<14} {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "`dlop COMMAND --help` describes a command's arguments; `dlop --version` prints dlop's version."]
    return "\n".join(lines)


def _report_usage() -> str:
    lines = ["usage: dlop report FILE.json... [--plots DIR] [--out FILE.md]", "       dlop report REPORT [ARGS...]",
             "", "reports:"]
    lines += [f"  {name:<10} {summary}" for name, (_, summary) in REPORTS.items()]
    lines += ["", "`dlop report REPORT --help` describes a report's arguments; benchmark JSON files make tables:", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        from dlop import __version__

        print(f"dlop {__version__}")
        return 0
    if args[0] not in COMMANDS:
        print(f"dlop: unknown command '{args[0]}'\n\n{_usage()}", file=sys.stderr)
        return 2
    name, rest = COMMANDS[args[0]][0], args[1:]
    if args[0] == "report" and rest and rest[0] in REPORTS:
        name, rest = REPORTS[rest[0]][0], rest[1:]
    elif args[0] == "report" and (not rest or rest[0] in ("-h", "--help")):
        print(_report_usage())
    module = importlib.import_module(name)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
