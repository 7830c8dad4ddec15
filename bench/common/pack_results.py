#!/usr/bin/env python3
"""Pack a benchmark run folder into the layout of bench/results/.

    bench/common/pack_results.py RUN_FOLDER...
    bench/common/pack_results.py --summary-omit measurements RUN_FOLDER     # a linearity report
    bench/common/pack_results.py --drop '*.png' --why 'WHY' RUN_FOLDER       # plots no README shows
    bench/common/pack_results.py --check-return FOLDER    # fits what a lent GPU machine's $OUT brings back

A packed run folder holds:

- README.md: date, commit, machine, command, the tables (a run.md is renamed
  README.md where there is no README.md);
- summary.json: the run's figures. Where the run wrote one JSON outside a
  raw/ folder, its contents; where it wrote several, {"files": {path:
  contents}} (a file of several JSON documents gives their list), less any
  --summary-omit keys. Written on one line: `python3 -m json.tool
  summary.json` indents it;
- the plots (*.png, *.svg) at the folder's top level;
- raw.tar.xz: every other file, as the run wrote it, JSON included (so also
  the files summary.json was made from). The archive is deterministic (names
  sorted, mtime 0, owner 0, mode 0644, xz preset 9e): packing the same files
  gives the same bytes.

README.md ends with a "Files" section, written by this script, that says what
summary.json and raw.tar.xz hold, shows the plots and names what --drop
removed. Packing a packed folder changes nothing; files added to it since
are merged into raw.tar.xz and summary.json is made again from all of it.
Only the standard library is used, so bench/run_*.sh can call it with any
python3.

--check-return says whether a folder fits what a command on a lent GPU
machine brings back from its $OUT (RETURN_LIMITS): the GPU scripts pack
their run there and check it before the command ends, and the rehearsal in
tests/bench/test_gpu_plan.py checks the same.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import json
import lzma
import re
import sys
import tarfile
from pathlib import Path, PurePosixPath

ARCHIVE = "raw.tar.xz"
SUMMARY = "summary.json"
README = "README.md"
PLOTS = (".png", ".svg")
MARK = "<!-- Files: written by bench/pack_results.py -->"
XZ_PRESET = 9 | lzma.PRESET_EXTREME
# What a command on the lent GPU machine brings back of its $OUT: more files, larger ones, deeper ones or
# names of other characters stay behind.
RETURN_LIMITS = {"files": 8, "file_bytes": 16 << 20, "total_bytes": 64 << 20, "folders_down": 2}
RETURN_NAME = re.compile(r"[A-Za-z0-9._-]+")


def return_problems(folder: Path) -> list[str]:
    """Why `folder` would not come back whole from a lent GPU machine's $OUT (empty: it would)."""
    problems, files, total = [], [], 0
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(not RETURN_NAME.fullmatch(part) for part in rel.parts):
            problems.append(f"{rel}: a name of other characters than letters, digits, '.', '_' and '-'")
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            problems.append(f"{rel}: not a plain file or folder")
        elif path.is_file():
            files.append(rel)
            total += path.stat().st_size
            if len(rel.parts) - 1 > RETURN_LIMITS["folders_down"]:
                problems.append(f"{rel}: more than {RETURN_LIMITS['folders_down']} folders down")
            if path.stat().st_size > RETURN_LIMITS["file_bytes"]:
                problems.append(f"{rel}: {path.stat().st_size} bytes, over {RETURN_LIMITS['file_bytes']}")
    if len(files) > RETURN_LIMITS["files"]:
        problems.append(f"{len(files)} files, over {RETURN_LIMITS['files']}: {', '.join(map(str, files))}")
    if total > RETURN_LIMITS["total_bytes"]:
        problems.append(f"{total} bytes in all, over {RETURN_LIMITS['total_bytes']}")
    return problems


def _documents(data: bytes) -> list | None:
    """The JSON documents of a file (one, or several written one after another); None if it is not JSON."""
    try:
        body = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    decoder, docs, at = json.JSONDecoder(), [], 0
    try:
        while True:
            while at < len(body) and body[at].isspace():
                at += 1
            if at == len(body):
                return docs or None
            doc, at = decoder.raw_decode(body, at)
            docs.append(doc)
    except json.JSONDecodeError:
        return None


def summary_of(members: dict[str, bytes], omit=()) -> tuple[object | None, list[str], bool]:
    """summary.json's contents, the JSON files it holds, and whether it is one file's one document.

    Its files: the archive's JSON files outside raw/ folders. omit: top-level keys of their documents that
    summary.json leaves to the archive.
    """
    parsed = {}
    for name in sorted(members):
        if not name.endswith(".json") or "raw" in PurePosixPath(name).parts[:-1]:
            continue
        docs = _documents(members[name])
        if docs is None:
            continue
        docs = [{k: v for k, v in d.items() if k not in omit} if isinstance(d, dict) else d for d in docs]
        parsed[name] = docs[0] if len(docs) == 1 else docs
    if not parsed:
        return None, [], False
    if len(parsed) == 1:
        name = next(iter(parsed))
        if len(_documents(members[name])) == 1:
            return parsed[name], [name], True
    return {"files": parsed}, list(parsed), False


def dump_summary(summary: object) -> bytes:
    return (json.dumps(summary, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def tar_xz(members: dict[str, bytes]) -> bytes:
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(members[name]), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(members[name]))
    return lzma.compress(plain.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)


def read_archive(path: Path) -> dict[str, bytes]:
    members = {}
    with tarfile.open(path, mode="r:xz") as tar:
        for info in tar.getmembers():
            if info.isfile():
                members[info.name] = tar.extractfile(info).read()
    return members


def _braces(names: list[str]) -> list[str]:
    """Names of one shape (the same text around their numbers) as patterns that cover exactly them.

    Patterns equal but in one number merge, the last number first: run{1,2,3}.json, then {2,4}ranks_run{1,2}.json.
    """
    split = [re.split(r"(\d+)", n) for n in names]
    slots = range(1, len(split[0]), 2)
    patterns = [tuple((s[i],) for i in slots) for s in split]
    for k in reversed(range(len(slots))):
        merged: dict[tuple, set] = {}
        for pat in patterns:
            merged.setdefault(pat[:k] + pat[k + 1:], set()).update(pat[k])
        patterns = [key[:k] + (tuple(sorted(v, key=int)),) + key[k:] for key, v in merged.items()]
    out = []
    for pat in patterns:
        parts = list(split[0])
        for k, v in enumerate(pat):
            parts[2 * k + 1] = v[0] if len(v) == 1 else "{" + ",".join(v) + "}"
        out.append("".join(parts))
    return out


def _group(names: list[str]) -> list[str]:
    """Names that differ only in their numbers, written once: run{1,2,3}.json, allreduce_{2,4}ranks_run{1,2}.json."""
    shapes: dict[str, list[str]] = {}
    for name in sorted(names):
        shapes.setdefault(re.sub(r"\d+", "#", name), []).append(name)
    patterns = []
    for group in shapes.values():
        patterns += _braces(group)
    return [f"`{p}`" for p in sorted(patterns)]


def listing(names: list[str]) -> str:
    """Top-level names (grouped), and each folder as `folder/` with its count of files."""
    top = [n for n in sorted(names) if "/" not in n]
    folders: dict[str, int] = {}
    for n in names:
        if "/" in n:
            first = n.split("/", 1)[0]
            folders[first] = folders.get(first, 0) + 1
    parts = _group(top) + [f"`{d}/` ({c} file{'s' if c != 1 else ''})" for d, c in sorted(folders.items())]
    return ", ".join(parts)


def files_section(members: dict[str, bytes], sources: list[str], as_written: bool,
                  plots: list[str], dropped: list[str], omit: list[str]) -> str:
    lines = []
    without = ""
    if omit:
        keys = ", ".join(f"`{k}`" for k in omit)
        without = f" without {keys} (the archive's copy has {'it' if len(omit) == 1 else 'them'})"
    indent = f"on one line (`python3 -m json.tool {SUMMARY}` indents it)"
    if sources and as_written:
        lines.append(f"- `{SUMMARY}`: the figures: `{sources[0]}`{without}, {indent}.")
    elif sources:
        lines.append(f"- `{SUMMARY}`: the figures: {listing(sources)}{without}, as "
                     f'`{{"files": {{path: contents}}}}`, {indent}.')
    if members:
        lines.append(f"- `{ARCHIVE}`: the files the run wrote but README.md and the plots, as it wrote them "
                     f"(`tar -xJf {ARCHIVE}` unpacks them here): {listing(list(members))}.")
    if plots:
        lines.append("- Plots: " + " ".join(f"![{p}]({p})" for p in plots))
    lines += dropped
    if not lines:
        return ""
    return "\n".join([MARK, "## Files", ""] + lines) + "\n"


def _old_dropped(readme: str) -> list[str]:
    at = readme.find(MARK)
    if at < 0:
        return []
    return [line for line in readme[at:].splitlines() if line.startswith("- Dropped")]


def pack(folder: Path, drop: list[str], why: str | None, omit: list[str] = ()) -> str:
    if not folder.is_dir():
        raise SystemExit(f"{folder}: not a folder")
    archive = folder / ARCHIVE
    packed = archive.exists()
    members = read_archive(archive) if packed else {}
    loose = sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    readme_path = folder / README
    rename_run_md = not readme_path.exists() and (folder / "run.md").is_file()

    added, removed, dropped_names, plots = {}, [], [], []
    for path in loose:
        rel = path.relative_to(folder).as_posix()
        if rel in (README, ARCHIVE, ARCHIVE + ".tmp") or (rel == SUMMARY and packed):
            continue
        if rename_run_md and rel == "run.md":
            continue
        if any(fnmatch.fnmatchcase(rel, g) for g in drop):
            dropped_names.append(rel)
            removed.append(path)
            continue
        if "/" not in rel and rel.lower().endswith(PLOTS):
            plots.append(rel)
            continue
        if path.is_symlink():
            raise SystemExit(f"{path}: a link; copy what it points at into the run folder, or remove it")
        data = path.read_bytes()
        if rel in members and members[rel] != data:
            raise SystemExit(f"{path}: differs from the file of that name in {archive}; rename it, or unpack "
                             f"the archive (tar -xJf), remove the old file and its archive, and pack again")
        added[rel] = data
        removed.append(path)

    shown = readme_path.exists() and all(f"]({p})" in readme_path.read_text(encoding="utf-8") for p in plots)
    if not added and not dropped_names and not rename_run_md and shown:
        return f"{folder}: packed already" if packed else f"{folder}: nothing to pack"
    if drop and not dropped_names:
        raise SystemExit(f"{folder}: nothing matches --drop {' '.join(drop)}")

    members.update(added)
    summary, sources, as_written = summary_of(members, omit)
    if rename_run_md:
        (folder / "run.md").rename(readme_path)
    readme = readme_path.read_text(encoding="utf-8") if readme_path.exists() else ""
    old_dropped = _old_dropped(readme)
    if readme.find(MARK) >= 0:
        readme = readme[:readme.find(MARK)].rstrip("\n") + "\n"
    dropped = old_dropped
    if dropped_names:
        reason = why or "not needed: summary.json and README.md hold what they showed"
        names = ", ".join(f"`{n}`" for n in dropped_names)
        dropped = dropped + [f"- Dropped: {names}: {reason} (`git log -- <path>` finds them in the history)."]

    if members:
        tmp = folder / (ARCHIVE + ".tmp")
        tmp.write_bytes(tar_xz(members))
        tmp.replace(archive)
    for path in removed:  # a summary.json the run wrote among them: it is in the archive now
        path.unlink()
    if summary is not None:
        (folder / SUMMARY).write_bytes(dump_summary(summary))
    elif (folder / SUMMARY).exists():
        (folder / SUMMARY).unlink()
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(sub.iterdir()):
            sub.rmdir()
    section = files_section(members, sources, as_written, sorted(plots), dropped, list(omit))
    if section:
        readme = (readme.rstrip("\n") + "\n\n" if readme.strip() else "") + section
    readme_path.write_text(readme, encoding="utf-8")
    return f"{folder}: {len(added)} file(s) into {ARCHIVE}, {len(dropped_names)} dropped"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", metavar="RUN_FOLDER")
    p.add_argument("--drop", action="append", default=[], metavar="GLOB",
                   help="remove the files of this path pattern (relative to the run folder) instead of packing them")
    p.add_argument("--why", help="why --drop's files are not needed (written into README.md)")
    p.add_argument("--summary-omit", action="append", default=[], metavar="KEY",
                   help="a top-level key of the JSON files that summary.json leaves to the archive "
                        "(e.g. a linearity report's per-run `measurements`)")
    p.add_argument("--check-return", action="store_true",
                   help="pack nothing: say whether each folder fits what a lent GPU machine's $OUT brings back")
    args = p.parse_args(argv)
    if args.check_return:
        bad = 0
        for folder in args.folders:
            problems = return_problems(Path(folder))
            print(f"{folder}: " + ("fits the device machine's return limits" if not problems else
                                   "would not come back whole: " + "; ".join(problems)))
            bad += bool(problems)
        return 1 if bad else 0
    for folder in args.folders:
        print(pack(Path(folder), args.drop, args.why, args.summary_omit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
