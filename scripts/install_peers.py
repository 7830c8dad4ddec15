"""Installs the loaders the offload benchmark measures dlop against (pyproject.toml's extra "peers") into this
Python, leaving every package it has already at its version: torch, torchvision and numpy are what dlop's
extension is built against, and a peer's upper pin on a common package (DALI caps ``packaging``) must not move it.

    python scripts/install_peers.py [--dry-run]

A peer that pip cannot resolve under those pins is installed without its dependencies, then its dependencies
but the pinned ones. Already installed peers are left as they are, so a second run downloads nothing.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def _pip(args: list[str], dry_run: bool) -> int:
    cmd = [sys.executable, "-m", "pip", "install", "-q", *(["--dry-run"] if dry_run else []), *args]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def main(argv: list[str]) -> int:
    dry_run = "--dry-run" in argv
    peers = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["peers"]
    # Every installed package stays at its version: a peer's requirement on one must accept the version here.
    pins = {d.metadata["Name"].lower().replace("_", "-"): d.version for d in metadata.distributions()}
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
        constraints = f.name
    missing = [p for p in peers if not _installed(_name(p))]
    for peer in missing:
        if _pip(["-c", constraints, peer], dry_run) == 0:
            continue
        print(f"# {peer}: its pins would move packages installed here; installing it without them", flush=True)
        if _pip(["--no-deps", peer], dry_run) != 0:
            return 1
        if dry_run:
            continue
        wanted = [r for r in metadata.requires(_name(peer)) or [] if "extra ==" not in r and _name(r) not in pins]
        if wanted and _pip(["-c", constraints, *wanted], dry_run) != 0:
            return 1
    if not missing:
        print("# the peers are installed: " + ", ".join(peers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
