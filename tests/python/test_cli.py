"""The `dlop` console script dispatches to each tool's own main."""

import os
import subprocess
import sys
from pathlib import Path

DLOP = Path(sys.executable).with_name("dlop")


def run(*args, **kwargs):
    return subprocess.run([str(DLOP), *args], capture_output=True, text=True, timeout=120, **kwargs)


def test_help_lists_every_command():
    result = run("--help")
    assert result.returncode == 0
    for command in ("make-dataset", "pack"):
        assert command in result.stdout


def test_unknown_command_is_an_error_naming_it():
    result = run("no-such-command")
    assert result.returncode == 2
    assert "no-such-command" in result.stderr


def test_make_dataset_then_pack(tmp_path):
    folder = tmp_path / "images"
    result = run("make-dataset", str(folder), "--classes", "2", "--per-class", "3", "--seed", "7")
    assert result.returncode == 0, result.stderr
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert len(classes) == 2
    files = sorted(f for c in classes for f in os.listdir(folder / c))
    assert len(files) == 6
    packed = tmp_path / "images.dlrec"
    result = run("pack", str(folder), str(packed))
    assert result.returncode == 0, result.stderr
    assert packed.stat().st_size > sum((folder / c / f).stat().st_size for c in classes for f in os.listdir(folder / c))
