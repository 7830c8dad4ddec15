"""Every documented `python -m bench.NAME` finds its benchmark in the lab's family folders (bench.COMMANDS)."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import bench

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"""(?:-m |"-m", ")bench\.(\w+)""")


def _documented() -> dict[str, str]:
    """NAME -> the first file that runs `python -m bench.NAME` (docs, README, scripts, Makefile, tests, the lab
    and the results index; run folders keep the commands of their day)."""
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "bench" / "results" / "README.md"]
    for folder in ("docs", "scripts", "tests", "bench", "examples"):
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in {".md", ".py", ".sh"}
                  and "results" not in p.relative_to(ROOT).parts and "__pycache__" not in p.parts
                  and p != Path(__file__).resolve()]
    found = {}
    for path in files:
        for name in COMMAND.findall(path.read_text(encoding="utf-8", errors="replace")) if path.is_file() else []:
            found.setdefault(name, str(path.relative_to(ROOT)))
    found.pop("NAME", None)
    return found


def test_every_documented_command_is_in_the_table():
    documented = _documented()
    assert {"c10d", "ddp", "train", "offload", "linearity", "autoscale", "netns"} <= set(documented), documented
    missing = {name: where for name, where in documented.items() if name not in bench.COMMANDS}
    assert not missing, f"python -m bench.NAME documented but not in bench.COMMANDS: {missing}"


def test_each_command_resolves_to_its_module_file():
    for name, module in bench.COMMANDS.items():
        spec = importlib.util.find_spec(f"bench.{name}")
        if spec.submodule_search_locations is not None:  # a family folder of that name: runpy runs its __main__
            spec = importlib.util.find_spec(f"bench.{name}.__main__")
        assert spec is not None and spec.origin == importlib.util.find_spec(module).origin, (name, spec)


def test_a_family_command_and_a_moved_command_run_under_their_names():
    for name in ("ddp", "c10d"):
        run = subprocess.run([sys.executable, "-m", f"bench.{name}", "--help"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0 and f"usage: python -m bench.{name} " in run.stdout, run.stdout + run.stderr
    unknown = subprocess.run([sys.executable, "-m", "bench.no_such_benchmark"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert unknown.returncode != 0 and "No module named bench.no_such_benchmark" in unknown.stderr, unknown.stderr
