"""`dlop slurm-template`: prints the SLURM batch script that runs a training
under `dlop run` in het group 0 and `dlop offloader` in het group 1
(examples/slurm/dlop_hetjob.sbatch; docs/fleets.md explains it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "templates" / "slurm_hetjob.sbatch"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="dlop slurm-template", description=__doc__).parse_args(argv)
    sys.stdout.write(TEMPLATE.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
