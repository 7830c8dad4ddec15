#!/usr/bin/env bash
# Checks that the c10d backend (backend/src, backend/python) still compiles
# against an older torch: downloads that torch's wheel once (no install, no
# dependencies, nothing touches .venv), unpacks its headers, and compiles
# every backend translation unit with -fsyntax-only, using the flags of the
# configured build (build/compile_commands.json) with torch's include folders
# and C++ ABI swapped for the wheel's. Exits non-zero on any error.
#
#   scripts/check_torch_compat.sh [TORCH_VERSION]     # default 2.4.1
#
# Environment: BUILD (build folder, default build), JOBS (parallel compiles,
# default 2), DLOP_TORCH_COMPAT_CACHE (download cache, default
# ~/.cache/dlop/torch-compat), PYTHON (the pip to download with, default
# python3; the wheel is picked for the venv's Python version).
# Not part of `make test`: the wheel is ~800 MB (kept in the cache; about a
# minute of compiling on 2 cores once it is there). Linking is not checked.
set -euo pipefail

version="${1:-2.4.1}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-build}"
[[ "$build" = /* ]] || build="$root/$build"
jobs="${JOBS:-2}"
cache="${DLOP_TORCH_COMPAT_CACHE:-$HOME/.cache/dlop/torch-compat}/$version"
python="${PYTHON:-python3}"

db="$build/compile_commands.json"
if [[ ! -f "$db" ]]; then
  echo "check_torch_compat: no $db: configure the build first (make build)" >&2
  exit 2
fi

pyver="3.11"
if [[ -x "$root/.venv/bin/python" ]]; then
  pyver="$("$root/.venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
fi

site="$cache/site"
if [[ ! -f "$site/.unpacked" ]]; then
  mkdir -p "$cache"
  wheel="$(ls "$cache"/torch-"$version"-*.whl 2>/dev/null | head -n1 || true)"
  if [[ -z "$wheel" ]]; then
    echo "check_torch_compat: downloading torch $version for Python $pyver into $cache"
    "$python" -m pip download "torch==$version" --no-deps --only-binary=:all: \
      --python-version "$pyver" --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
      -d "$cache" >&2
    wheel="$(ls "$cache"/torch-"$version"-*.whl | head -n1)"
  fi
  rm -rf "$site"
  mkdir -p "$site"
  # Headers and the Python sources (to read torch.distributed's API); not the
  # shared libraries, which a syntax-only compile does not need.
  unzip -q -o "$wheel" -d "$site" -x 'torch/lib/*' '*.so'
  touch "$site/.unpacked"
fi

inc="$site/torch/include"
api="$inc/torch/csrc/api/include"
[[ -d "$inc/c10" ]] || { echo "check_torch_compat: no headers under $inc" >&2; exit 2; }
abi=1
if grep -q '_GLIBCXX_USE_CXX11_ABI=0' "$site/torch/share/cmake/Torch/TorchConfig.cmake" 2>/dev/null; then
  abi=0
fi
echo "check_torch_compat: torch $(grep -h 'define TORCH_VERSION ' -A1 "$api/torch/version.h" | tr -d '\n\\"' | sed 's/.*TORCH_VERSION *//') headers, _GLIBCXX_USE_CXX11_ABI=$abi, $jobs job(s)"

if [[ $abi -eq 0 ]]; then
  echo "check_torch_compat: note: this torch uses the pre-C++11 ABI; cmake/DlopTorch.cmake refuses to build dlop._C" \
    "against it (dlop's other libraries and Debian's fmt/spdlog use the C++11 ABI): only its headers are checked here"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/dlop-torch-compat.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# One shell command per backend TU: the build's command with -o/-c dropped,
# the precompiled header replaced by a copy of its source (the .gch next to it
# was made with the installed torch), torch's include folders swapped.
"$python" - "$db" "$root" "$inc" "$api" "$abi" "$work" <<'EOF'
import json, os, re, shlex, shutil, sys
db, root, inc, api, abi, work = sys.argv[1:]
entries = json.load(open(db))
n = 0
for e in entries:
    f = os.path.realpath(e["file"])
    rel = os.path.relpath(f, root)
    if not (rel.startswith("backend/src/") or rel.startswith("backend/python/")) or not rel.endswith(".cpp"):
        continue
    args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    out, i, torch_seen = [], 0, False
    while i < len(args):
        a = args[i]
        if a in ("-o", "-c"):
            i += 2
            continue
        if a == "-Winvalid-pch":
            i += 1
            continue
        if a == "-include" and args[i + 1].endswith("cmake_pch.hxx"):
            copy = os.path.join(work, "pch%d.hxx" % n)
            shutil.copyfile(args[i + 1], copy)
            out += ["-include", copy]
            i += 2
            continue
        if a == "-idirafter" and "/torch/include" in args[i + 1]:
            if not torch_seen:
                out += ["-idirafter", inc, "-idirafter", api]
                torch_seen = True
            i += 2
            continue
        if a.startswith("-D_GLIBCXX_USE_CXX11_ABI="):
            out.append("-D_GLIBCXX_USE_CXX11_ABI=" + abi)
            i += 1
            continue
        out.append(a)
        i += 1
    if not torch_seen:
        sys.exit("check_torch_compat: no torch include folder in the command for " + rel)
    out += ["-fsyntax-only", f]
    with open(os.path.join(work, "tu%02d.sh" % n), "w") as sh:
        sh.write("cd %s && %s\n" % (shlex.quote(e["directory"]), shlex.join(out)))
    with open(os.path.join(work, "tu%02d.name" % n), "w") as nm:
        nm.write(rel)
    n += 1
if n == 0:
    sys.exit("check_torch_compat: no backend translation units in " + db)
EOF

start=$SECONDS
status=0
ls "$work"/tu*.sh | xargs -P "$jobs" -I{} bash -c '
  name="$(cat "${1%.sh}.name")"
  if bash "$1" >"${1%.sh}.log" 2>&1; then echo "ok      $name"; else echo "FAILED  $name"; touch "${1%.sh}.failed"; fi
' _ {} || true
for failed in "$work"/tu*.failed; do
  [[ -e "$failed" ]] || continue
  status=1
  echo "=== $(cat "${failed%.failed}.name") ==="
  grep -E 'error|note: ' "${failed%.failed}.log" | head -n 60 || cat "${failed%.failed}.log"
done
echo "check_torch_compat: torch $version: $([[ $status -eq 0 ]] && echo clean || echo errors) in $((SECONDS - start)) s"
exit $status
