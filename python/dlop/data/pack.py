"""Packs a folder by class (torchvision's ImageFolder layout) or a manifest into one record file.

    dlop pack ROOT OUT [--kind image|video|audio]

The record file (format in offload/src/source/record_format.hpp) keeps each
file's bytes, labels, time span and relative path in the source's order,
with CRC-32 checksums; dlop's native sources read it with mmap. Video
records also carry each file's frame index (every frame's pts and keyframe
flag), computed once here, so the offloaders never scan a file.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time


def pack(root: str, out: str, progress: bool = False, kind: str = "image") -> dict:
    """Writes `out` from the folder or manifest `root`; returns {"records", "classes", "bytes"}. `progress`: a bar
    on stderr while stderr is a terminal."""
    from dlop._C import media

    def run(r, o):
        return media.pack(r, o, kind)

    if not progress or not sys.stderr.isatty() or not os.path.isdir(root):
        return run(os.fspath(root), os.fspath(out))
    return _pack_with_bar(run, os.fspath(root), os.fspath(out))


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
    parser = argparse.ArgumentParser(prog="dlop pack", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="a folder with one sub-folder per class, or a .csv/.jsonl manifest")
    parser.add_argument("out", help="record file to write (replaced atomically), or an s3:// or http(s):// URL to "
                                    "upload it to (docs/offload.md)")
    parser.add_argument("--kind", choices=("image", "video", "audio"), default="image",
                        help="which files a folder's classes hold")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    stats = pack(args.root, args.out, progress=True, kind=args.kind)
    print(
        f"{stats['records']} records in {stats['classes']} classes, {stats['bytes'] / 1e6:.1f} MB, "
        f"to {args.out} ({time.perf_counter() - start:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
