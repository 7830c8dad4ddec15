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
   holds (as bench/common/pack_results.py leaves it):
   - README.md, which records the command and the machine: a "Command" line
     (or heading) and a "Machine" line that gives the cores (or else
     summary.json has a header with `command`, `cpu` and `cores`);
   - summary.json, the run's figures, wherever raw.tar.xz holds JSON;
   - plots (*.png, *.svg);
   - at most one archive, raw.tar.xz, of everything else the run wrote.
   Nothing else, and no subfolders.
3. Every relative link of a tracked markdown file that points into
   bench/results/ resolves: to a tracked file, or to a folder that holds
   tracked files.
4. bench/results/ stays a size a clone carries: under 400 tracked files and
   under 5 MB (5,000,000 bytes) in all.
5. docs/architecture.md stays readable in one sitting: at most 400 lines.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import posixpath
import re
import subprocess
import tarfile
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
PLOT = re.compile(r"^[^/]+\.(?:png|svg)$")
MAX_RESULT_FILES = 400
MAX_RESULT_BYTES = 5_000_000
MAX_ARCHITECTURE_LINES = 400
# A markdown link's or image's target: [text](target "title"), [text](<target>), [label]: target.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*)?\)|^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.M | re.S)
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
    if "README.md" in files:
        body = text(f"{run}/README.md") or ""
        if COMMAND_LINE.search(body) and any(CORES.search(m.group(0)) for m in MACHINE_FIELD.finditer(body)):
            return True
    if "summary.json" in files:
        try:
            summary = json.loads(text(f"{run}/summary.json") or "null")
        except json.JSONDecodeError:
            return False
        docs = [summary]
        if isinstance(summary, dict) and isinstance(summary.get("files"), dict):
            docs = [d for v in summary["files"].values() for d in (v if isinstance(v, list) else [v])]
        for doc in docs:
            header = doc.get("header") if isinstance(doc, dict) else None
            if isinstance(header, dict) and header.get("command") and header.get("cpu") and header.get("cores"):
                return True
    return False


def _archive_has_json(path: str) -> bool:
    with tarfile.open(ROOT / path, mode="r:xz") as tar:
        return any(name.endswith(".json") for name in tar.getnames())


def test_results_are_one_folder_per_benchmark_and_run():
    runs, problems = _run_folders()
    assert runs, "no run folders under bench/results/<benchmark>/<run>/"
    for run, files in sorted(runs.items()):
        name = PurePosixPath(run).name
        if not RUN_NAME.match(name):
            problems.append(f"{run}: a run folder is named <YYYY-MM-DD>-<short commit>")
        other = [f for f in files if f not in ("README.md", "summary.json", "raw.tar.xz") and not PLOT.match(f)]
        if other:
            problems.append(f"{run}: holds README.md, summary.json, plots and raw.tar.xz only, not "
                            f"{', '.join(sorted(other)[:5])}{' ...' if len(other) > 5 else ''} "
                            f"(pack it: bench/common/pack_results.py {run})")
        if "README.md" not in files:
            problems.append(f"{run}: no README.md")
        if "raw.tar.xz" in files and "summary.json" not in files and _archive_has_json(f"{run}/raw.tar.xz"):
            problems.append(f"{run}: raw.tar.xz holds JSON but there is no summary.json")
        if not _records_command_and_machine(run, files):
            problems.append(f"{run}: no README.md with a Command line and a Machine line (with its cores), "
                            "and no summary.json header with command, cpu and cores")
    assert not problems, "\n".join(problems)


def _links_into_results() -> list[tuple[str, str, str]]:
    """(markdown file, link target, repository path) of every relative link into bench/results/."""
    found = []
    for path in tracked():
        if not path.endswith(".md"):
            continue
        body = FENCE.sub("", text(path) or "")
        for m in LINK.finditer(body):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
                continue
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target.split("#")[0]))
            if resolved == str(RESULTS) or resolved.startswith(f"{RESULTS}/"):
                found.append((path, target, resolved))
    return found


def test_links_into_results_resolve():
    files = set(tracked())
    folders = {str(parent) for f in files for parent in PurePosixPath(f).parents}
    links = _links_into_results()
    assert links, "no markdown links into bench/results/ found: is the link pattern right?"
    broken = [f"{md}: {target}" for md, target, path in links if path not in files and path not in folders]
    assert not broken, ("links into bench/results/ that resolve to no tracked file or folder (a file packed "
                        "into raw.tar.xz: link its run folder instead):\n" + "\n".join(broken))


def test_results_stay_small():
    results = [p for p in tracked() if p.startswith(f"{RESULTS}/")]
    size = sum((ROOT / p).stat().st_size for p in results)
    assert len(results) < MAX_RESULT_FILES, f"bench/results/ has {len(results)} tracked files (< {MAX_RESULT_FILES})"
    assert size < MAX_RESULT_BYTES, f"bench/results/ is {size:,} bytes (< {MAX_RESULT_BYTES:,})"


def _packer():
    spec = importlib.util.spec_from_file_location("pack_results", ROOT / "bench" / "common" / "pack_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_architecture_fits_one_sitting():
    lines = (ROOT / "docs/architecture.md").read_text().count("\n")
    assert lines <= MAX_ARCHITECTURE_LINES, (
        f"docs/architecture.md has {lines} lines; keep it at {MAX_ARCHITECTURE_LINES} or fewer "
        "(details belong in the headers and docs it names)")


def test_pack_results_makes_the_layout_deterministically(tmp_path):
    pack = _packer().pack
    written = {
        "README.md": "# r\n\n- Machine: x, 2 cores\n- Command: `c`\n",
        "run1.json": '{"header": {"command": "c"}, "rows": [1.5]}\n',
        "run2.json": '{"rows": [2]}\n{"rows": [3]}\n',
        "run1.txt": "printed\n",
        "plot.png": "png",
        "raw/a.json": '{"raw": true}\n',
    }
    for copy in ("a", "b"):
        for name, body in written.items():
            (tmp_path / copy / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / copy / name).write_text(body)
        pack(tmp_path / copy, [], None)
    a, b = tmp_path / "a", tmp_path / "b"
    assert sorted(p.name for p in a.iterdir()) == ["README.md", "plot.png", "raw.tar.xz", "summary.json"]
    assert (a / "raw.tar.xz").read_bytes() == (b / "raw.tar.xz").read_bytes()
    assert json.loads((a / "summary.json").read_text()) == {
        "files": {"run1.json": {"header": {"command": "c"}, "rows": [1.5]}, "run2.json": [{"rows": [2]}, {"rows": [3]}]}}
    with tarfile.open(a / "raw.tar.xz") as tar:
        assert tar.getnames() == ["raw/a.json", "run1.json", "run1.txt", "run2.json"]
        assert tar.extractfile("run2.json").read().decode() == written["run2.json"]
    readme = (a / "README.md").read_text()
    assert readme.startswith(written["README.md"]) and "![plot.png](plot.png)" in readme
    before = {p.name: p.read_bytes() for p in a.iterdir()}
    assert pack(a, [], None).endswith("packed already")
    assert {p.name: p.read_bytes() for p in a.iterdir()} == before
