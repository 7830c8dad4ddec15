# Sourced by the GPU scripts (gpu_headline.sh, gpu_check.sh): the clock, the
# preflight and the packing that every command on the lent GPU machine shares.
#
# A command there is stopped at 10 minutes and brings back only what lies
# under the $OUT it is given: at most 8 files of 16 MiB, at most 2 folders
# down. So each script
# - writes its steps' files into WORK (a folder of its own, not brought back);
# - after each step writes WORK as it stands into $OUT/partial.tar.xz (fast:
#   xz -1), so that a command stopped from outside still brings back the
#   steps that finished;
# - checks the clock before each step: a step that would end past BUDGET
#   seconds from the start (GPU_BUDGET, default 480: the 8 minutes a command
#   is planned for) is skipped with a note, and each step runs under a timeout
#   that ends it before then;
# - at the end (also on an error or a signal) packs WORK into $OUT with
#   bench/common/pack_results.py: README.md, summary.json, the plots and raw.tar.xz,
#   and checks them against the limits above (pack_results.py --check-return).
#
#   gpu_begin BENCH OUT     OUT: the folder to fill (made; emptied first)
#   gpu_preflight ARGS...   scripts/gpu_preflight.py ARGS $GPU_PREFLIGHT_ARGS, at most GPU_PREFLIGHT_SECONDS
#                           (15); exits 1 naming what is missing
#   gpu_left                seconds left of BUDGET
#   gpu_step NAME EST CMD...  CMD if EST seconds fit in what is left (its output to WORK/NAME.txt);
#                           returns 0 when it ran and passed, 3 when skipped, else 1. GPU_STEPS, where
#                           set, names the steps to run (the others are listed as not run).
#   gpu_build               scripts/gpu_build.sh as a step, then its environment in this shell
#   gpu_skip NAME WHY       record a step that did not run
#   gpu_note TEXT           a line for README.md
#   gpu_snapshot            WORK into $OUT/partial.tar.xz
#   gpu_finish              pack into $OUT (also run by the EXIT trap); the exit status says how it went
#                           (0 ok, 2 steps skipped for time, 1 a step failed). Where the pack is too large to
#                           come back, it packs again without the files of GPU_DROP (patterns under WORK).
#
# The script calls gpu_machine COMMAND after gpu_begin, and defines gpu_readme
# (prints README.md's body, starting with gpu_readme_head TITLE) before calling
# gpu_finish.

GPU_RESERVE=${GPU_RESERVE:-25}  # seconds kept for packing at the end

gpu_begin() {
  GPU_BENCH=$1 OUT=$2
  START=${GPU_START:-$(date +%s)}
  BUDGET=${GPU_BUDGET:-480}
  PY=${PY:-${PYTHON:-python3}}
  REV=$(git rev-parse --short HEAD 2>/dev/null || cat .gpu_data/rev 2>/dev/null || echo unknown)
  DATE=$(date -u +%Y-%m-%d)
  mkdir -p "$OUT" || exit 1
  OUT=$(cd "$OUT" && pwd)
  find "$OUT" -mindepth 1 -delete
  WORK=$(mktemp -d "/tmp/gpu-$GPU_BENCH-XXXX")
  STATUS=0 SKIPPED=0 GPU_FINISHED=0
  : >"$WORK/steps.tsv"
  : >"$WORK/notes.txt"
  exec > >(tee "$WORK/$GPU_BENCH.log") 2>&1
  trap 'gpu_finish; exit $?' EXIT
  trap 'echo "stopped by a signal after $(gpu_elapsed) s"; STATUS=1; exit 1' TERM INT
  echo "# $GPU_BENCH at $REV, $(date -u +%Y-%m-%dT%H:%M:%SZ), budget $BUDGET s, results into $OUT"
}

# The run's machine and command, into WORK/machine.txt; COMMAND is kept for gpu_readme_head.
gpu_machine() {
  COMMAND=$1
  {
    echo "command: $COMMAND"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    command -v nvidia-smi >/dev/null && timeout 8 nvidia-smi --query-gpu=name,memory.total,driver_version \
      --format=csv,noheader | sed 's/^/gpu: /'
  } | tee "$WORK/machine.txt"
}

# README.md's first lines: TITLE, then the Date, Commit, Machine and Command lines.
gpu_readme_head() {
  echo "# $GPU_BENCH: $1"
  echo
  echo "- Date: $DATE (UTC)"
  echo "- Commit: $REV"
  echo "- Machine: $(grep -E '^(cpu|gpu|torch)' "$WORK/machine.txt" | cut -d' ' -f2- | paste -sd ';' -)"
  echo "- Command: \`$COMMAND\` (scripts/gpu_plan.md)"
}

gpu_elapsed() { echo $(($(date +%s) - START)); }
gpu_left() { echo $((BUDGET - $(date +%s) + START)); }
gpu_note() { echo "$*" >>"$WORK/notes.txt"; echo "note: $*"; }

gpu_preflight() {
  local t0=$SECONDS
  # shellcheck disable=SC2086  # GPU_PREFLIGHT_ARGS: more options, e.g. --shm-min-mib 4096
  mkdir -p "$WORK/raw"  # raw/: in the archive, not in summary.json
  timeout "${GPU_PREFLIGHT_SECONDS:-15}" "$PY" scripts/gpu_preflight.py --device "${DEV:-cuda}" "$@" \
    --json "$WORK/raw/preflight.json" ${GPU_PREFLIGHT_ARGS:-} | tee "$WORK/preflight.txt"
  local rc=${PIPESTATUS[0]}
  echo "preflight took $((SECONDS - t0)) s"
  sed -n 's/^ok *torch: /torch: /p' "$WORK/preflight.txt" >>"$WORK/machine.txt"  # the Machine line's torch
  ((rc == 124)) && echo "preflight: did not finish in ${GPU_PREFLIGHT_SECONDS:-15} s: stuck after the last item above"
  ((rc == 0)) || { STATUS=1; exit 1; }
}

# gpu_build: the build (scripts/gpu_build.sh) as a step, then its environment here (PYTHONPATH, LD_LIBRARY_PATH,
# UCX_MODULE_DIR: a second source finds it configured and built). About 150 s on a fresh machine, seconds on
# one that kept build-gpu/ from the command before. Exits where it failed or did not fit.
gpu_build() {
  local est=240
  compgen -G "python/dlop/_C*.so" >/dev/null && [[ -f build-gpu/CMakeCache.txt ]] && est=30
  gpu_step build "$est" bash -c 'source scripts/gpu_build.sh "$1"' _ "$WORK/build" || exit 1
  source scripts/gpu_build.sh "$WORK/build" >/dev/null || { STATUS=1; exit 1; }
}

gpu_skip() {
  printf '%s\tskipped\t0\t%s\n' "$1" "$2" >>"$WORK/steps.tsv"
  echo "== $1: SKIPPED ($2)"
  SKIPPED=1
}

# gpu_step NAME EST CMD...: runs CMD (output to WORK/NAME.txt) if EST seconds, and the reserve for packing,
# fit in what is left; under a timeout that ends it before the budget does either way.
gpu_step() {
  local name=$1 est=$2; shift 2
  if [[ -n ${GPU_STEPS:-} && " $GPU_STEPS " != *" $name "* ]]; then
    printf '%s\tnot run\t0\tnot in GPU_STEPS\n' "$name" >>"$WORK/steps.tsv"
    return 3
  fi
  local left; left=$(gpu_left)
  if ((left < est + GPU_RESERVE)); then
    gpu_skip "$name" "$left s left of the $BUDGET s budget, the step takes about $est s"
    return 3
  fi
  echo "== $name ($(gpu_elapsed) s in): $*"
  local t0=$SECONDS rc
  timeout -k 10 $((left - GPU_RESERVE)) "$@" >"$WORK/$name.txt" 2>&1
  rc=$?
  local took=$((SECONDS - t0)) result=ok
  if ((rc == 124 || rc == 137)); then
    result=cut; echo "   CUT at the budget after $took s (see $name.txt)"; STATUS=1
  elif ((rc != 0)); then
    result=FAILED; echo "   FAILED after $took s (see $name.txt)"; tail -15 "$WORK/$name.txt"; STATUS=1
  else
    echo "   ok, $took s"
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$result" "$took" "$*" >>"$WORK/steps.tsv"
  gpu_snapshot
  [[ $result == ok ]]
}

gpu_snapshot() {
  tar -C "$WORK" -cf - . 2>/dev/null | xz -1 -T0 >"$OUT/partial.tar.xz.tmp" &&
    mv "$OUT/partial.tar.xz.tmp" "$OUT/partial.tar.xz"
}

# The steps as README lines: "- NAME: ok, 12 s", "- NAME: skipped (why)".
gpu_steps_md() {
  awk -F'\t' '{ if ($2 == "skipped" || $2 == "not run") printf "- `%s`: %s (%s)\n", $1, $2, $4;
                else printf "- `%s`: %s, %d s: `%s`\n", $1, $2, $3, $4 }' "$WORK/steps.tsv"
}

gpu_finish() {
  ((GPU_FINISHED)) && return "$STATUS"
  GPU_FINISHED=1
  trap - EXIT
  echo "took $(gpu_elapsed) s in all; packing into $OUT"
  local stage drop=() packed=0
  for attempt in whole lean; do
    stage=$(mktemp -d "/tmp/gpu-$GPU_BENCH-pack-XXXX")
    cp -a "$WORK"/. "$stage"/
    if declare -F gpu_readme >/dev/null; then gpu_readme >"$stage/README.md"; fi
    if "$PY" bench/common/pack_results.py "${drop[@]}" "$stage" >/dev/null &&
        "$PY" bench/common/pack_results.py --check-return "$stage"; then
      packed=1; break
    fi
    rm -rf "$stage"
    # Too large to come back: leave out what GPU_DROP names (raw traces; their summaries stay).
    [[ -n ${GPU_DROP:-} ]] || break
    # shellcheck disable=SC2086  # GPU_DROP: patterns
    for pattern in $GPU_DROP; do compgen -G "$WORK/$pattern" >/dev/null && drop+=(--drop "$pattern"); done
    ((${#drop[@]})) || break
    drop+=(--why "too large to come back from the GPU machine's \$OUT (16 MiB a file); the summaries keep what they showed")
  done
  if ((packed)); then
    find "$OUT" -mindepth 1 -delete
    cp -a "$stage"/. "$OUT"/
    rm -rf "$stage" "$WORK"
  else
    echo "packing failed: $OUT keeps partial.tar.xz"; gpu_snapshot; STATUS=1
  fi
  ((STATUS == 0 && SKIPPED)) && STATUS=2
  case $STATUS in
    0) echo "RESULT ok: every step ran; $(ls "$OUT" | paste -sd ' ' -) in $OUT" ;;
    2) echo "RESULT partial: steps skipped for time (README.md names them); $(ls "$OUT" | paste -sd ' ' -) in $OUT" ;;
    *) echo "RESULT failed: see README.md and raw.tar.xz in $OUT" ;;
  esac
  return "$STATUS"
}
