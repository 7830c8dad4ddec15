"""Rules for the repository's own files, checked on every tracked file (`git ls-files`).

1. Nothing names a numbered stage of the project's development, or who did what.
   The project is described as it is, not as a story of how it got there.
   - Paths: no part of a tracked path is `session<N>`, `round<N>` or `quiet<N>`
     (with or without a space, `_` or `-` before the number).
   - Every tracked text file: no `session <N>` (also `sessions <N>-<M>`,
     `session-<N>`, `session_<N>`), no `quiet<N>`, and no session named from
     where the writer stood: "this", "that", "previous", "next", "earlier",
     "later", "other", "another" or "same" followed by the word session.
   - Markdown files (`*.md`) and Python docstrings: no `round <N>` either. A
     development round reads the same as an algorithm's round, so there an
     algorithm's rounds are written without a bare number ("round r", "the
     first round"). C++ sources and the raw output under bench/results/ may
     number an algorithm's or a measurement loop's rounds.
   - Markdown files: no person credited with the work that ran beside a
     measurement (WHO below): a measurement says what ran beside it, not
     whose it was.
2. bench/results/ holds one folder per benchmark and nothing else but its
   README.md; a benchmark's folder holds one folder per run (and optionally
   its README.md). A run folder is named `<YYYY-MM-DD>-<short commit>` and
   records its command and its machine: a README.md or run.md in it has a
   "Command" line (or heading) and a "Machine" line that gives the cores, or a
   JSON file in it has a header with `command`, `cpu` and `cores`.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from functools import lru_cache
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
RESULTS = PurePosixPath("bench/results")

STAGE_IN_PATH = re.compile(r"(?i)(?<![a-z])(session|round|quiet)[ _-]?\d")
STAGE_IN_TEXT = re.compile(
    r"(?i)\bsessions?[ _-]?\d"
    r"|\bquiet\d"
    r"|\b(?:this|that|previous|next|earlier|later|other|another|same)\s+sessions?\b"
)
ROUND_NUMBER = re.compile(r"(?i)\bround[ _-]?\d")
WHO = re.compile(
    r"(?i)\b(?:a|the|another|other|\d+|two|three|seven|eight)\s+helpers?(?:['\u2019]s?)?\s+"
    r"(?:build|builds|built|building|jobs?|tests?|were|was)\b"
    r"|\bhelpers['\u2019]"
    r"|\bthe\s+lead['\u2019]s\b"
)
RUN_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[0-9a-f]{7,12}$")
COMMAND_LINE = re.compile(r"(?im)^\s*(?:[-*]\s+)?(?:#{1,6}\s+)?(?:\*\*)?commands?\b")
# The Machine field: its line and the indented lines that continue it; it must give the cores.
MACHINE_FIELD = re.compile(r"(?im)^\s*(?:[-*]\s+)?(?:#{1,6}\s+)?(?:\*\*)?machine\b.*(?:\n[ \t]+\S.*)*")
CORES = re.compile(r"(?i)\bcores?\b")


@lru_cache(maxsize=1)
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    # Files deleted in the working tree but not yet in the index are gone for these rules.
    return tuple(p for p in out.decode().split("\0") if p and (ROOT / p).is_file())


@lru_cache(maxsize=None)
def text(path: str) -> str | None:
    data = (ROOT / path).read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def docstrings(source: str) -> list[tuple[int, str]]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


def hits(pattern: re.Pattern, body: str, first_line: int = 1) -> list[str]:
    return [f"{first_line + body.count(chr(10), 0, m.start())}: {m.group(0)!r}" for m in pattern.finditer(body)]


def test_no_path_names_a_development_stage():
    bad = [p for p in tracked() if any(STAGE_IN_PATH.search(part) for part in PurePosixPath(p).parts)]
    assert not bad, "paths naming a numbered stage of development:\n" + "\n".join(bad)


def test_no_text_names_a_development_stage_or_who_did_what():
    problems = []
    for path in tracked():
        body = text(path)
        if body is None:
            continue
        found = hits(STAGE_IN_TEXT, body)
        if path.endswith(".md"):
            found += hits(ROUND_NUMBER, body) + hits(WHO, body)
        elif path.endswith(".py"):
            for line, doc in docstrings(body):
                found += hits(ROUND_NUMBER, doc, line)
        problems += [f"{path}:{h}" for h in found]
    assert not problems, "development stages or people named (see this test's docstring):\n" + "\n".join(problems)


def _run_folders() -> tuple[dict[str, list[str]], list[str]]:
    """Run folder -> its tracked files (relative to it); and files in the wrong place."""
    runs: dict[str, list[str]] = {}
    misplaced = []
    for path in tracked():
        parts = PurePosixPath(path).parts
        if parts[:2] != RESULTS.parts:
            continue
        rest = parts[2:]
        if len(rest) == 1 and rest[0] != "README.md":
            misplaced.append(f"{path}: bench/results/ holds benchmark folders and README.md only")
        elif len(rest) == 2 and rest[1] != "README.md":
            misplaced.append(f"{path}: a benchmark's folder holds run folders and README.md only")
        elif len(rest) >= 3:
            runs.setdefault(str(PurePosixPath(*parts[:4])), []).append(str(PurePosixPath(*rest[2:])))
    return runs, misplaced


def _records_command_and_machine(run: str, files: list[str]) -> bool:
    for name in ("README.md", "run.md"):
        if name in files:
            body = text(f"{run}/{name}") or ""
            if COMMAND_LINE.search(body) and any(CORES.search(m.group(0)) for m in MACHINE_FIELD.finditer(body)):
                return True
    for name in files:
        if "/" in name or not name.endswith(".json"):
            continue
        try:
            header = json.loads(text(f"{run}/{name}") or "null")
        except json.JSONDecodeError:
            continue
        header = header.get("header") if isinstance(header, dict) else None
        if isinstance(header, dict) and header.get("command") and header.get("cpu") and header.get("cores"):
            return True
    return False


def test_results_are_one_folder_per_benchmark_and_run():
    runs, problems = _run_folders()
    assert runs, "no run folders under bench/results/<benchmark>/<run>/"
    for run, files in sorted(runs.items()):
        name = PurePosixPath(run).name
        if not RUN_NAME.match(name):
            problems.append(f"{run}: a run folder is named <YYYY-MM-DD>-<short commit>")
        if not _records_command_and_machine(run, files):
            problems.append(f"{run}: no README.md/run.md with a Command line and a Machine line (with its cores), "
                            "and no JSON header with command, cpu and cores")
    assert not problems, "\n".join(problems)
