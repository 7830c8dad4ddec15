"""tests/conftest.py's rule for tests marked alone: a failed call runs once more, and the log names the
retry, its reason and the first run's failure; a passing or unmarked test runs once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

TESTS = '''
import os
from pathlib import Path

import pytest

COUNT = Path(os.environ["RUNS"])


def _run(name):
    runs = COUNT / name
    runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
    return len(runs.read_text())


@pytest.mark.alone(reason="a rate a burst of load can move")
def test_flaky():
    assert _run("flaky") > 1, "slower than the bound"


@pytest.mark.alone(reason="a rate")
def test_broken():
    assert _run("broken") < 0, "always wrong"


@pytest.mark.alone
def test_steady():
    _run("steady")


def test_unmarked():
    assert _run("unmarked") > 1
'''


def test_an_alone_test_that_fails_runs_once_more_and_says_so(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_cases.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: measured alone\n")
    runs = tmp_path / "runs"
    runs.mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"RUNS": str(runs), "PATH": "/usr/bin:/bin"})
    out = done.stdout
    assert {p.name: len(p.read_text()) for p in runs.iterdir()} == \
        {"flaky": 2, "broken": 2, "steady": 1, "unmarked": 1}, out
    assert "2 failed, 2 passed" in out and done.returncode == 1, out
    assert "retried once: test_cases.py::test_flaky (passed): a rate a burst of load can move; the first run " \
           "failed: AssertionError: slower than the bound" in out, out
    assert "retried once: test_cases.py::test_broken (failed): a rate; the first run failed: AssertionError: " \
           "always wrong" in out, out
    assert "test_steady" not in out.split("retried once")[-1] and out.count("retried once: ") == 2, out
