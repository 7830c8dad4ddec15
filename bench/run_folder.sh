# Sourced by the bench/run_*.sh scripts: the run folder of a benchmark and its run.md.
#
#   run_folder BENCHMARK TITLE COMMAND...
# sets $out to $DLOP_OUT, or else bench/results/BENCHMARK/<UTC date>-<short commit>/,
# makes it, and writes run.md there (date, commit, machine; appends the
# command when the folder already has one, e.g. a second configuration run
# the same day at the same commit). See bench/results/README.md.
run_folder() {
  local benchmark=$1 title=$2
  shift 2
  local commit
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  out=${DLOP_OUT:-bench/results/$benchmark/$(date -u +%Y-%m-%d)-$commit}
  mkdir -p "$out"
  if [ ! -f "$out/run.md" ]; then
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
    } >"$out/run.md"
  fi
  echo "- Command: \`$*\`" >>"$out/run.md"
}
