#!/usr/bin/env bash
# Puts what a GPU command brought back into bench/results/, as a run folder:
#
#   scripts/gpu_unpack.sh FILES_AT     (the run tool's files_at: the $OUT of one command)
#
# A packed $OUT (README.md, summary.json, plots, raw.tar.xz, as the GPU scripts
# leave it) is copied to bench/results/<bench>/<date>-<commit>/, the three read
# from its README.md ("# <bench>: ...", "- Date:", "- Commit:"). A $OUT that
# holds only partial.tar.xz (the command was stopped from outside before it
# packed) is unpacked, given a README.md from its machine.txt and steps.tsv,
# and packed. Refuses to write into a run folder that exists.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
src=${1:?usage: scripts/gpu_unpack.sh FILES_AT}
[[ -d $src ]] || { echo "$src: not a folder" >&2; exit 1; }

if [[ ! -f $src/README.md && -f $src/partial.tar.xz ]]; then
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  tar -xJf "$src/partial.tar.xz" -C "$work"
  log=$(cd "$work" && ls ./*.log 2>/dev/null | head -1)
  bench=$(basename "${log:-unknown.log}" .log)
  rev=$(sed -n 's/^# .* at \([0-9a-f]*\),.*/\1/p' "$work/$log" | head -1)
  date=$(sed -n 's/^# .* at [0-9a-f]*, \([0-9-]*\)T.*/\1/p' "$work/$log" | head -1)
  {
    echo "# $bench: stopped before it packed (what partial.tar.xz held)"
    echo
    echo "- Date: ${date:-unknown} (UTC)"
    echo "- Commit: ${rev:-unknown}"
    echo "- Machine: $(grep -E '^(cpu|gpu|torch)' "$work/machine.txt" 2>/dev/null | cut -d' ' -f2- | paste -sd ';' -)"
    echo "- Command: \`$(sed -n 's/^command: //p' "$work/machine.txt" 2>/dev/null)\` (scripts/gpu_plan.md)"
    echo
    echo "## Steps"
    echo
    awk -F'\t' '{ printf "- `%s`: %s, %s s\n", $1, $2, $3 }' "$work/steps.tsv" 2>/dev/null
  } >"$work/README.md"
  src=$work
fi
[[ -f $src/README.md ]] || { echo "$src: no README.md and no partial.tar.xz: nothing came back" >&2; exit 1; }
bench=$(sed -n '1s/^# \([A-Za-z0-9_]*\)[: ].*/\1/p' "$src/README.md")
date=$(sed -n 's/^- Date: \([0-9-]*\).*/\1/p' "$src/README.md" | head -1)
rev=$(sed -n 's/^- Commit: \([0-9a-z]*\).*/\1/p' "$src/README.md" | head -1)
[[ -n $bench && -n $date && -n $rev ]] || { echo "$src/README.md: no bench, Date or Commit line" >&2; exit 1; }
dest=bench/results/$bench/$date-$rev
[[ -e $dest ]] && { echo "$dest exists: move it away first, or unpack by hand" >&2; exit 1; }
mkdir -p "$dest"
cp "$src"/* "$dest"/
rm -f "$dest/partial.tar.xz"
"$PY" bench/common/pack_results.py "$dest"
echo "unpacked into $dest: $(ls "$dest" | paste -sd ' ' -)"
echo "next: write what the figures show into $dest/README.md, and the run into bench/results/README.md's table"
