#!/usr/bin/env bash
# make gpu-carry: makes here, in one command, everything a lent GPU machine
# lacks for scripts/gpu_headline.sh and scripts/gpu_check.sh, then checks that
# it travels:
#
# - .gpu_deps/: the Debian packages and the minimal FFmpeg build that dlop's
#   build there needs (scripts/gpu_deps.sh; made once, kept while complete);
# - .gpu_data/video: the headline's clips (scripts/gpu_headline.sh --prepare;
#   the machine has no ffmpeg to make them), and .gpu_data/rev, the commit
#   measured (the copy there has no .git);
# - .whl/: wheels of the Python packages the machine lacks. None today: dlop
#   needs torch, cloudpickle and tqdm, the scripts cv2 and matplotlib, and the
#   machine has them all (.library KINDS.md's list); name one in WHEELS to
#   carry it.
#
# Then it sums what a device run copies (the tracked files, the untracked files
# git does not ignore, and the carried paths) against the 64 MiB limit and
# prints the carry list for the run tool (at most 8 paths). Exit 1 when over.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
LIMIT=$((64 << 20))
WHEELS=()  # e.g. (somepackage==1.2): none is missing there today

if [[ -f .gpu_deps/.complete ]]; then
  echo ".gpu_deps is there ($(du -sh .gpu_deps | cut -f1); rm -r .gpu_deps to refresh)"
else
  scripts/gpu_deps.sh
  touch .gpu_deps/.complete
fi
if [[ -f .gpu_data/video/.complete ]]; then
  echo ".gpu_data/video is there ($(du -sh .gpu_data/video | cut -f1))"
else
  PYTHON=$PY scripts/gpu_headline.sh --prepare
  touch .gpu_data/video/.complete
fi
git rev-parse --short HEAD >.gpu_data/rev
carry=(.gpu_deps .gpu_data)
if ((${#WHEELS[@]})); then
  rm -rf .whl
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${WHEELS[@]}"
  carry+=(.whl)
fi

# What a device run copies: tracked files and untracked files git does not ignore, as they are now, plus the carried.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null |
  awk '{s += $1} END {print s + 0}')
carried=$(du -sb "${carry[@]}" | awk '{s += $1} END {print s + 0}')
total=$((tree + carried))
printf 'tree %.1f MiB + carried %.1f MiB (%s) = %.1f MiB of %d MiB\n' "$(bc -l <<<"$tree / 1048576")" \
  "$(bc -l <<<"$carried / 1048576")" "$(du -sh "${carry[@]}" | awk '{printf "%s%s %s", s, $2, $1; s=", "}')" \
  "$(bc -l <<<"$total / 1048576")" $((LIMIT >> 20))
if ((total > LIMIT)); then
  echo "over the device machine's 64 MiB: carry less, or ignore what need not travel" >&2
  exit 1
fi
echo "carry: [$(printf '"%s", ' "${carry[@]}" | sed 's/, $//')]"
