#!/usr/bin/env bash
# The headline on one accelerator: dlop's offloaded preprocessing feeding it,
# against torch's DataLoader and on-device decoding (python -m bench.train
# --device DEV). One kind per command on the lent GPU machine
# (scripts/gpu_plan.md has the whole visit):
#
#   scripts/gpu_headline.sh image "$OUT"    (then, in a second command: video)
#
# and once here, before the visit (make gpu-carry does it), to make the clips
# it carries (the GPU machine has no ffmpeg command-line tool to make them):
#
#   scripts/gpu_headline.sh --prepare   (writes .gpu_data/video, ignored by git: carried with .gpu_deps)
#
# Steps: a preflight (scripts/gpu_preflight.py, at most 15 s, naming every
# missing piece), the build on CUDA (scripts/gpu_build.sh; incremental when the
# machine kept build-gpu/ from the command before), the built-in data, then
# each row of bench.train in an invocation of its own (headline rows first:
# scripts/gpu_rows.py), with K=4 trainer cores, the other cores for one
# dlop-offloader each, and fixed DataLoader worker counts (STOCK_WORKERS, K by
# default; ALL_WORKERS, every core): no probe. Before each row the clock is
# checked (scripts/gpu_lib.sh): rows that would end past GPU_BUDGET seconds
# (default 480) are skipped, and README.md names them. The rows are merged into
# <kind>.json, <kind>.md and <kind>.png, and the run is packed into OUT as
# bench/results/ keeps it: README.md, summary.json, <kind>.png, raw.tar.xz.
# OUT defaults to bench/results/train_gpu/<date>-<commit> (video: train_gpu_video).
#
# Settings (environment): DEV (cuda; dlop_test rehearses here without a build),
# K (4), ROW_SECONDS (15), SIZE (full, or tiny: small images, clips and
# models, for a rehearsal on 2 cores), ROWS (every row of bench.train),
# GPU_BUDGET (480), STOCK_WORKERS, ALL_WORKERS, PYTHON.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY=${PYTHON:-python3}
DEV=${DEV:-cuda}
SIZE=${SIZE:-full}
if [[ ${1:-} == --prepare ]]; then
  # 64 clips of 10 s, 480x270, H.264 with B-frames and a keyframe every 2-10 s, at most 300 kbit/s: under 25 MB.
  mkdir -p .gpu_data
  rm -rf .gpu_data/video
  "$PY" -m dlop.data.make_dataset .gpu_data/video --kind video --classes 8 --per-class 8 --size 480x270 \
    --seconds 10 --fps 30 --codec h264 --gop-seconds 2,10 --kbps 300 --jobs "$(nproc)" || exit 1
  du -sh .gpu_data
  exit 0
fi
KIND=${1:-}
[[ $KIND == image || $KIND == video ]] ||
  { echo "usage: scripts/gpu_headline.sh image|video [OUT] | --prepare" >&2; exit 2; }
BENCH=train_gpu; [[ $KIND == video ]] && BENCH=train_gpu_video
source scripts/gpu_lib.sh
REV=$(git rev-parse --short HEAD 2>/dev/null || cat .gpu_data/rev 2>/dev/null || echo unknown)
gpu_begin "$BENCH" "${2:-bench/results/$BENCH/$(date -u +%Y-%m-%d)-$REV}"

K=${K:-4}
ROW_SECONDS=${ROW_SECONDS:-15}
CORES=$(nproc)
STOCK_WORKERS=${STOCK_WORKERS:-$K}
ALL_WORKERS=${ALL_WORKERS:-$CORES}
gpu_machine "DEV=$DEV K=$K ROW_SECONDS=$ROW_SECONDS SIZE=$SIZE GPU_BUDGET=$BUDGET scripts/gpu_headline.sh $KIND OUT"

gpu_readme() {
  gpu_readme_head "bench.train --device $DEV --kind $KIND, K=$K, one row per invocation"
  echo
  echo "DataLoader workers fixed, not probed: stock $STOCK_WORKERS, stock_all_cores $ALL_WORKERS."
  [[ -s $WORK/notes.txt ]] && { echo; sed 's/^/- /' "$WORK/notes.txt"; }
  echo
  echo "## Steps"
  echo
  gpu_steps_md
  if [[ -f $WORK/$KIND.md ]]; then echo; sed "1s/^# /## /" "$WORK/$KIND.md"; fi
}

# --- preflight: every missing piece named at once, in at most 15 s
need=torch,matplotlib,shm,cores
[[ $DEV == cuda* ]] && need+=,cv2,nvidia-smi,disk
[[ $KIND == video ]] && need+=,video_reader
gpu_preflight --need "$need" --min-cores $((K + 1))

# --- the build (CUDA), then its environment for the rows (a second source finds it built)
if [[ $DEV == cuda* ]]; then
  gpu_build
  export DLOP_OFFLOADER=${DLOP_OFFLOADER:-$PWD/build-gpu/offload/daemon/dlop-offloader}
fi

# --- the rows' options
COMMON=(--device "$DEV" --kind "$KIND" --trainer-cores "$K" --seconds "$ROW_SECONDS" --workers "$STOCK_WORKERS"
  --all-cores-workers "$ALL_WORKERS")
if [[ $SIZE == tiny ]]; then
  # Minutes on 2 cores: small JPEGs and clips, tiny models; dlop_test's cost model stands in for a GPU's compute.
  COMMON+=(--warmup 2)
  [[ $DEV == dlop_test* ]] && COMMON+=(--test-op-us 20 --test-tflops 0.005)
  [[ $KIND == image ]] && COMMON+=(--model tiny_cnn --size 64 --batch 8 --samples 48 --image-size 800x600)
  [[ $KIND == video ]] && COMMON+=(--model tiny_3d --frames 4 --short-side 40,48 --crop 32 --batch 4 --classes 10
    --samples 16 --clip-size 128x72 --clip-seconds 2)
  EST=$(awk -v s="$ROW_SECONDS" 'BEGIN {printf "%d", 3 * s + 25}')  # a row's start-up dominates on 2 busy cores
else
  [[ $KIND == image ]] && COMMON+=(--model resnet50 --batch 128)
  [[ $KIND == video ]] && COMMON+=(--model r3d_50 --batch 16)
  # Clips carried from the machine that ran --prepare (the GPU machine cannot make them).
  [[ $KIND == video && -d .gpu_data/video ]] && COMMON+=(--data .gpu_data/video)
  EST=$(awk -v s="$ROW_SECONDS" 'BEGIN {printf "%d", s + 25}')  # start-up, CUDA init, model, warm-up, the row
fi
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/dlop-headline-cache}
gpu_step data 60 "$PY" scripts/gpu_rows.py data "${COMMON[@]}"
(($? == 1)) && exit 1  # skipped for time: so are the rows, each with its note

# --- the rows, one invocation each, the clock checked before each
mkdir -p "$WORK/raw/rows"
ALL_ROWS=$("$PY" scripts/gpu_rows.py order)
skipped=()
for row in ${ROWS:-$ALL_ROWS}; do
  left=$(gpu_left)
  if ((left < EST + GPU_RESERVE + 10)); then  # 10: the merge
    gpu_skip "row_$row" "$left s left of the $BUDGET s budget, a row takes about $EST s"
    skipped+=(--skipped "$row=$left s left of the $BUDGET s budget, a row takes about $EST s")
    continue
  fi
  t0=$SECONDS
  gpu_step "row_$row" "$EST" "$PY" -m bench.train "${COMMON[@]}" --rows "$row" --json "$WORK/raw/rows/$row.json"
  case $? in
    0) grep -E "^ *$row " "$WORK/row_$row.txt" | tail -1 ;;
    3) skipped+=(--skipped "$row=too little of the budget left") ;;
    *) skipped+=(--skipped "$row=failed or cut: see row_$row.txt") ;;
  esac
  ((SECONDS - t0 > EST)) && EST=$((SECONDS - t0))  # the slowest row so far sets the estimate
done
if compgen -G "$WORK/raw/rows/*.json" >/dev/null; then
  gpu_step merge 10 "$PY" scripts/gpu_rows.py merge --json "$WORK/$KIND.json" --report "$WORK/report" \
    "${skipped[@]}" "$WORK"/raw/rows/*.json && cat "$WORK/merge.txt"
  [[ -f $WORK/report/train_device.png ]] && mv "$WORK/report/train_device.png" "$WORK/$KIND.png"
  [[ -f $WORK/report/train_device.md ]] && mv "$WORK/report/train_device.md" "$WORK/$KIND.md"
  rmdir "$WORK/report" 2>/dev/null
  # The merged table stands for the rows: their own JSON stay in the archive, their own plots add nothing.
fi
gpu_finish
