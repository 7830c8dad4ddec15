"""Packs an image folder (torchvision's ImageFolder layout) into one record file.

    python -m dlop.data.pack ROOT OUT

The record file (format in offload/src/source/record_format.hpp) keeps each
file's bytes, label and relative path in ImageFolder's order, with CRC-32
checksums; dlop's native sources read it with mmap.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def pack(root: str, out: str) -> dict:
    """Writes `out` from the folder `root`; returns {"records", "classes", "bytes"}."""
    from dlop._C import offload

    return offload.pack(os.fspath(root), os.fspath(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlop.data.pack", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="image folder: one sub-folder per class")
    parser.add_argument("out", help="record file to write (replaced atomically)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    stats = pack(args.root, args.out)
    print(
        f"{stats['records']} records in {stats['classes']} classes, {stats['bytes'] / 1e6:.1f} MB, "
        f"to {args.out} ({time.perf_counter() - start:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
