"""The installed package: import, version, executables on the venv's PATH."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^version\s*=\s*"([^"]+)"', project, re.M).group(1)


def _cmake_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(\s*dlop\s+VERSION\s+([0-9.]+)", text).group(1)


def test_import_and_version():
    import dlop

    assert dlop.__version__ == _pyproject_version()
    assert dlop.__version__ == _cmake_version()


def test_dlop_bench_on_venv_path():
    bench = Path(sys.prefix) / "bin" / "dlop-bench"
    assert bench.is_file(), f"{bench} missing: `make build` installs it"
    result = subprocess.run([str(bench), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
