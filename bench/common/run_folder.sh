# Sourced by the bench/collectives/run_*.sh scripts: the run folder of a benchmark, its README.md, and its packing.
#
#   run_folder BENCHMARK TITLE COMMAND...
# sets $out to $DLOP_OUT, or else bench/results/BENCHMARK/<UTC date>-<short commit>/,
# makes it, and writes README.md there (date, commit, machine; adds the
# command when the folder already has one, e.g. a second configuration run
# the same day at the same commit).
#
#   pack_run_folder
# packs $out (bench/common/pack_results.py): README.md, summary.json, the plots and
# raw.tar.xz. A second run into a packed folder is merged into it. See
# bench/results/README.md.
run_folder() {
  local benchmark=$1 title=$2
  shift 2
  local commit
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  out=${DLOP_OUT:-bench/results/$benchmark/$(date -u +%Y-%m-%d)-$commit}
  mkdir -p "$out"
  if [ ! -f "$out/README.md" ]; then
    local cpu dirty=""
    cpu=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
    [ -n "$cpu" ] || cpu=$(uname -m)
    [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=" (with uncommitted changes)"
    {
      echo "# $title"
      echo
      echo "- Date: $(date -u +%Y-%m-%d), from $(date -u +%H:%M) UTC"
      echo "- Commit: $commit$dirty"
      echo "- Machine: $cpu, $(nproc) cores ($(hostname)); load $(cut -d' ' -f1-3 /proc/loadavg) at the start"
    } >"$out/README.md"
  fi
  # The command goes before the Files section bench/common/pack_results.py ends a packed README.md with.
  awk -v line="- Command: \`$*\`" -v mark="<!-- Files: written by bench/pack_results.py -->" '
    /^$/ { held++; next }
    $0 == mark && !done { print line; done = 1 }
    { while (held > 0) { print ""; held-- } print }
    END { if (!done) print line }' "$out/README.md" >"$out/README.md.tmp"
  mv "$out/README.md.tmp" "$out/README.md"
}

pack_run_folder() {
  "${python:-python3}" bench/common/pack_results.py "$out"
}
