"""Packs an image folder (torchvision's ImageFolder layout) into one record file.

    python -m dlop.data.pack ROOT OUT

The record file (format in offload/src/source/record_format.hpp) keeps each
file's bytes, label and relative path in ImageFolder's order, with CRC-32
checksums; dlop's native sources read it with mmap.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time


def pack(root: str, out: str, progress: bool = False) -> dict:
    """Writes `out` from the folder `root`; returns {"records", "classes", "bytes"}. `progress`: a bar on stderr
    while stderr is a terminal."""
    from dlop._C import offload

    if not progress or not sys.stderr.isatty():
        return offload.pack(os.fspath(root), os.fspath(out))
    return _pack_with_bar(offload.pack, os.fspath(root), os.fspath(out))


def _pack_with_bar(pack_fn, root: str, out: str) -> dict:
    """Runs the pack (which releases the GIL) in a thread and shows how much of the folder's bytes its temporary
    file (OUT.tmp.PID, written in ImageFolder order) holds."""
    from tqdm import tqdm

    total = sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(root) for name in names)
    tmp = f"{out}.tmp.{os.getpid()}"
    result: dict = {}

    def work():
        try:
            result["stats"] = pack_fn(root, out)
        except BaseException as e:  # re-raised in the caller's thread
            result["error"] = e

    thread = threading.Thread(target=work, daemon=True)
    with tqdm(total=total, unit="B", unit_scale=True, desc="pack", file=sys.stderr, dynamic_ncols=True,
              leave=False) as bar:
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
            with contextlib.suppress(OSError):
                bar.update(min(os.path.getsize(tmp), total) - bar.n)
    if "error" in result:
        raise result["error"]
    return result["stats"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlop.data.pack", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="image folder: one sub-folder per class")
    parser.add_argument("out", help="record file to write (replaced atomically)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    stats = pack(args.root, args.out, progress=True)
    print(
        f"{stats['records']} records in {stats['classes']} classes, {stats['bytes'] / 1e6:.1f} MB, "
        f"to {args.out} ({time.perf_counter() - start:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
