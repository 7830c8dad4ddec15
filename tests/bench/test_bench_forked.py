"""bench.common.forked's cases (forked_cases.py), run in a fresh interpreter: forking is refused in a process
holding threads, which earlier tests in this worker may have left behind."""

import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("forked_cases.py")


def test_forked_cases_in_a_fresh_interpreter():
    # The signal method: the thread method's watchdog is a thread, and forking is refused beside one.
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-o", "timeout_method=signal", str(CASES)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout, done.stdout[-2000:]
