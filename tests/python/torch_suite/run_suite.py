"""Runs torch's distributed_test suite on one backend and records each result.

    python -m torch_suite.run_suite --backend dlop --all --out dlop.jsonl
    python -m torch_suite.run_suite --backend dlop-as-gloo --all --out as-gloo.jsonl
    python -m torch_suite.run_suite --backend gloo -k allreduce --out gloo.jsonl
    python -m torch_suite.run_suite --compare gloo.jsonl dlop.jsonl as-gloo.jsonl

(run from tests/python; suite_cases.py says what the backends mean). Every finished test is appended to --out at once as
one JSON line {test, status, seconds, detail}, so a long run in the background
can be watched and an interrupted one keeps what it did. --compare lists the
tests Gloo passes and no dlop run passes, minus docs/torch_suite_exclusions.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
EXCLUSIONS = REPO / "docs" / "torch_suite_exclusions.md"


def configure_environment(backend: str, world_size: int, timeout_s: int) -> None:
    """Sets what distributed_test reads at import; the spawned ranks inherit it."""
    os.environ["TORCH_SUITE_BACKEND"] = backend
    os.environ["BACKEND"] = "gloo" if backend == "dlop-as-gloo" else backend
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(timeout_s)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    # The ranks import torch_suite.suite_cases by name.
    here = str(Path(__file__).resolve().parents[1])
    if here not in sys.path:
        sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))


def all_test_names() -> list[str]:
    from torch_suite.suite_cases import TestTorchSuite

    return list(unittest.TestLoader().getTestCaseNames(TestTorchSuite))


class RecordingResult(unittest.TextTestResult):
    """Appends one JSON line per finished test to `sink`."""

    def __init__(self, sink, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sink = sink
        self._started = 0.0

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def _record(self, test, status, detail=""):
        row = {
            "test": test._testMethodName,
            "status": status,
            "seconds": round(time.monotonic() - self._started, 2),
            "detail": detail[-2000:],
        }
        self._sink.write(json.dumps(row) + "\n")
        self._sink.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "xfail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "fail", "unexpected success")


def run(names: list[str], out: Path) -> dict[str, int]:
    from torch_suite.suite_cases import TestTorchSuite

    suite = unittest.TestSuite(TestTorchSuite(name) for name in names)
    with out.open("a") as sink:
        runner = unittest.TextTestRunner(
            stream=sys.stderr,
            verbosity=2,
            resultclass=lambda *a, **k: RecordingResult(sink, *a, **k),
        )
        runner.run(suite)
    return summarize(load(out))


def load(path: Path) -> dict[str, dict]:
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["test"]] = row
    return rows


def summarize(rows: dict[str, dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    counts["seconds"] = round(sum(r["seconds"] for r in rows.values()))
    return counts


def load_exclusions(path: Path = EXCLUSIONS) -> dict[str, str]:
    """test name -> reason, from the table rows "| `test_name` | reason |"."""
    if not path.exists():
        return {}
    found = {}
    for match in re.finditer(r"^\|\s*`(test_\w+)`\s*\|\s*(.*?)\s*\|\s*$", path.read_text(), re.M):
        found[match.group(1)] = match.group(2)
    return found


def best_of(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """One row per test: a passing one if any run passed it (dlop and dlop-as-gloo),
    else a failure (more telling than a skip)."""
    rank = {"pass": 0, "fail": 1, "error": 1}
    merged: dict[str, dict] = {}
    for rows in runs:
        for name, row in rows.items():
            if name not in merged or rank.get(row["status"], 2) < rank.get(merged[name]["status"], 2):
                merged[name] = row
    return merged


def regressions(gloo: dict[str, dict], dlop: dict[str, dict], exclusions: dict[str, str]):
    """(unexplained, excluded): tests Gloo passes and dlop does not."""
    lost = sorted(n for n, r in gloo.items() if r["status"] == "pass" and dlop.get(n, {}).get("status") != "pass")
    return [n for n in lost if n not in exclusions], [n for n in lost if n in exclusions]


def compare(gloo_path: Path, *dlop_paths: Path) -> int:
    gloo = load(gloo_path)
    print(f"gloo: {summarize(gloo)}")
    runs = [load(p) for p in dlop_paths]
    for path, rows in zip(dlop_paths, runs):
        print(f"{path.name}: {summarize(rows)}")
    dlop = best_of(runs)
    print(f"dlop, best of these runs: {summarize(dlop)}")
    unexplained, excluded = regressions(gloo, dlop, load_exclusions())
    for name in excluded:
        print(f"excluded  {name}: dlop {dlop.get(name, {}).get('status', 'not run')}")
    for name in unexplained:
        row = dlop.get(name, {"status": "not run", "detail": ""})
        print(f"REGRESSION {name}: dlop {row['status']}\n    {row['detail'][-600:]}")
    return 1 if unexplained else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["dlop", "dlop-as-gloo", "gloo"], default="dlop")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=120, help="per-test limit in seconds (the ranks are killed)")
    parser.add_argument("--all", action="store_true", help="every test of the suite")
    parser.add_argument("--tests", default="", help="comma-separated test names")
    parser.add_argument("-k", dest="pattern", default="", help="regular expression on test names")
    parser.add_argument("--skip-done", action="store_true", help="leave out tests already in --out")
    parser.add_argument("--list", action="store_true", help="print the selected names and stop")
    parser.add_argument("--out", type=Path, default=Path("torch_suite.jsonl"))
    parser.add_argument(
        "--compare", nargs="+", type=Path, metavar="FILE", help="GLOO.jsonl DLOP.jsonl [DLOP-AS-GLOO.jsonl ...]"
    )
    args = parser.parse_args(argv)

    if args.compare:
        return compare(*args.compare)
    configure_environment(args.backend, args.world_size, args.timeout)
    names = all_test_names()
    if args.tests:
        wanted = set(args.tests.split(","))
        missing = wanted - set(names)
        if missing:
            parser.error(f"not in the suite: {sorted(missing)}")
        names = [n for n in names if n in wanted]
    elif args.pattern:
        names = [n for n in names if re.search(args.pattern, n)]
    elif not args.all:
        parser.error("choose --all, --tests or -k")
    if args.skip_done and args.out.exists():
        done = load(args.out)
        names = [n for n in names if n not in done]
    if args.list:
        print("\n".join(names))
        return 0
    started = time.monotonic()
    counts = run(names, args.out)
    print(f"{args.backend}: {len(names)} tests in {time.monotonic() - started:.0f} s; totals in {args.out}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
