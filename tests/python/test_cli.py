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


def test_version_of_the_command_and_of_the_daemon():
    from processes import offloader

    import dlop

    result = run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"dlop {dlop.__version__}", result
    daemon = subprocess.run([offloader(), "--version"], capture_output=True, text=True, timeout=60)
    assert daemon.returncode == 0 and dlop.__version__ in daemon.stdout, daemon


def _command_lines():
    from dlop.cli import COMMANDS, REPORTS

    return [[name] for name in COMMANDS] + [["report", name] for name in REPORTS]


def test_every_command_usage_names_dlop_and_every_timeout_its_default():
    """A usage line a user copies must be one that runs: `dlop make-dataset`, not `python -m dlop.data...`."""
    for command in _command_lines():
        result = run(*command, "--help")
        assert result.returncode == 0, (command, result.stderr)
        usages = [line for line in result.stdout.splitlines() if line.startswith("usage:")]
        assert usages and all(u.startswith("usage: dlop ") for u in usages), (command, usages)
        assert "python -m dlop" not in result.stdout, (command, result.stdout)
        # Each option about waiting says how long it waits unless told.
        for option, text in _options(result.stdout):
            if "timeout" in option or option == "--wait":
                assert "default" in text, (command, option, text)


def _options(help_text: str):
    """(option, its help text) of an argparse --help."""
    found, name, text = [], None, []
    for line in help_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("--") and line.startswith("  "):
            if name:
                found.append((name, " ".join(text)))
            name, text = stripped.split()[0].rstrip(","), [stripped]
        elif name and line.startswith("     "):
            text.append(stripped)
        else:
            if name:
                found.append((name, " ".join(text)))
            name, text = None, []
    if name:
        found.append((name, " ".join(text)))
    return found


def test_the_daemon_help_shows_every_timeout_default():
    from processes import offloader

    help_text = subprocess.run([offloader(), "--help"], capture_output=True, text=True, timeout=60).stdout
    lines = [line for line in help_text.splitlines() if line.strip().startswith("--") and "timeout" in line.split()[0]]
    assert lines and all("=" in line.split()[1] for line in lines), lines  # CLI11 shows a default as TYPE=VALUE


def test_report_help_lists_its_reports():
    result = run("report", "--help")
    assert result.returncode == 0
    assert "linearity" in result.stdout and "trace" in result.stdout, result.stdout


def test_a_command_without_the_separator_is_told_to_use_it():
    result = run("run", "python", "x.py")
    assert result.returncode == 2
    assert "-- python x.py" in result.stderr, result.stderr


def test_make_dataset_refuses_a_folder_that_is_not_empty(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    result = run("make-dataset", str(folder), "--classes", "1", "--per-class", "1")
    assert result.returncode == 2 and "not empty" in result.stderr and "--force" in result.stderr, result.stderr
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    result = run("make-dataset", str(folder), "--classes", "1", "--per-class", "1", "--force")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["class_00", "notes.txt"]
