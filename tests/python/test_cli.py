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


def test_dlop_run_starts_the_command_without_importing_torch():
    """`dlop run` only parses and execs: torch in its own process would add seconds to every job's start.
    (Python's import log, which the exec'd command no longer writes to, lists what the dlop process imported.)"""
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1", DLOP_OFFLOAD_TOKEN="x")
    result = run("run", "--offloaders", "127.0.0.1:1", "--", "true", env=env)
    imported = [line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert result.returncode == 0 and "dlop.cli" in imported, result.stderr[-2000:]
    assert not [m for m in imported if m.split(".")[0] == "torch"], [m for m in imported if "torch" in m][:5]


def test_the_package_still_loads_the_backend_on_demand_in_the_dlop_command(tmp_path):
    """In the dlop command's process, dlop.init and dlop's errors still load the backend when asked."""
    script = tmp_path / "dlop"  # what makes a process "the dlop command": its main file's name
    script.write_text("import sys, dlop\n"
                      "light = 'torch' in sys.modules\n"
                      "import torch.distributed as dist\n"
                      "print(light, 'dlop' in dist.Backend.backend_list, dlop.PeerDeadError.__name__,\n"
                      "      'dlop' in dist.Backend.backend_list, callable(dlop.init))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # torch imported by the script itself registers dlop through its entry point, before dlop.init is asked for
    assert done.stdout.split() == ["False", "True", "PeerDeadError", "True", "True"], done.stdout


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
