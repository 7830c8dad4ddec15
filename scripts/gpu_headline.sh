#!/usr/bin/env bash
# The headline on one accelerator: dlop's offloaded preprocessing feeding it,
# against torch's DataLoader and on-device decoding (python -m bench.train
# --device DEV). One command on the lent GPU machine:
#
#   scripts/gpu_headline.sh [OUT]     (OUT: default bench/results/train_gpu/<date>-<commit>)
#
# and once here, before the visit, to make the clips it carries (the GPU
# machine has no ffmpeg command-line tool to make them):
#
#   scripts/gpu_headline.sh --prepare   (writes .gpu_data/video, ignored by git: carry it with .gpu_deps)
#
# On the GPU it builds dlop against the torch found there (scripts/gpu_build.sh),
# then runs --kind image and --kind video (KINDS) with K=4 trainer cores and the
# other cores for one dlop-offloader each, every row about SECONDS long; the
# whole visit, build included, is meant to fit about 10 minutes. Each kind
# writes OUT/<kind>.json, OUT/<kind>.txt and OUT/<kind>/train_device.{md,png}.
#
# Settings (environment): DEV (cuda; dlop_test rehearses here without a build),
# K (4), SECONDS (20), KINDS ("image video"), SIZE (full, or tiny: small
# images, clips and models, for a rehearsal on 2 cores), PYTHON.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY=${PYTHON:-python3}
DEV=${DEV:-cuda}
SIZE=${SIZE:-full}
if [[ ${1:-} == --prepare ]]; then
  # 64 clips of 10 s, 480x270, H.264 with B-frames and a keyframe every 2-10 s, at most 300 kbit/s: under 25 MB.
  mkdir -p .gpu_data
  grep -qxF '/.gpu_data/' .git/info/exclude 2>/dev/null || echo '/.gpu_data/' >>.git/info/exclude
  rm -rf .gpu_data/video
  "$PY" -m dlop.data.make_dataset .gpu_data/video --kind video --classes 8 --per-class 8 --size 480x270 \
    --seconds 10 --fps 30 --codec h264 --gop-seconds 2,10 --kbps 300 --jobs "$(nproc)" || exit 1
  du -sh .gpu_data
  exit 0
fi
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${1:-bench/results/train_gpu/$(date -u +%Y-%m-%d)-$REV}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_headline.log") 2>&1
START=$(date +%s)

{
  echo "# gpu_headline at $REV, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: DEV=$DEV K=${K:-4} ROW_SECONDS=${ROW_SECONDS:-20} SIZE=$SIZE KINDS=\"${KINDS:-image video}\" scripts/gpu_headline.sh $*"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader |
    sed 's/^/gpu: /'
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} | tee "$OUT/machine.txt"

if [[ $DEV == cuda* ]]; then
  source scripts/gpu_build.sh "$OUT" || exit 1
  export DLOP_OFFLOADER=${DLOP_OFFLOADER:-$PWD/build-gpu/offload/daemon/dlop-offloader}
  echo "build done after $(($(date +%s) - START)) s"
fi

K=${K:-4}
ROW_SECONDS=${ROW_SECONDS:-20}
COMMON=(--device "$DEV" --trainer-cores "$K" --seconds "$ROW_SECONDS" --probe-seconds 2)
declare -A EXTRA
if [[ $SIZE == tiny ]]; then
  # Minutes on 2 cores: small JPEGs and clips, tiny models; dlop_test's cost model stands in for a GPU's compute.
  COMMON+=(--warmup 2 --workers 1 --all-cores-workers 2)
  [[ $DEV == dlop_test* ]] && COMMON+=(--test-op-us 20 --test-tflops 0.005)
  EXTRA[image]="--model tiny_cnn --size 64 --batch 8 --samples 48 --image-size 800x600"
  EXTRA[video]="--model tiny_3d --frames 4 --short-side 40,48 --crop 32 --batch 4 --classes 10 --samples 16 --clip-size 128x72 --clip-seconds 2"
  EXTRA[audio]="--model tiny_audio --batch 8 --samples 16"
else
  EXTRA[image]="--model resnet50 --batch 128"
  EXTRA[video]="--model r3d_50 --batch 16"
  EXTRA[audio]="--model audio_transformer --batch 64"
fi
# Clips carried from the machine that ran --prepare; without them the built-in set is made here (needs ffmpeg).
[[ -d .gpu_data/video && $SIZE != tiny ]] && EXTRA[video]+=" --data .gpu_data/video"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/dlop-headline-cache}

status=0
for kind in ${KINDS:-image video}; do
  echo "== $kind ($(($(date +%s) - START)) s so far)"
  # shellcheck disable=SC2086  # EXTRA holds several options
  if "$PY" -m bench.train "${COMMON[@]}" --kind "$kind" ${EXTRA[$kind]} --json "$OUT/$kind.json" \
      --report "$OUT/$kind" >"$OUT/$kind.txt" 2>&1; then
    grep -v '^# .*/.* = ' "$OUT/$kind.txt" | tail -25
  else
    echo "   FAILED (see $OUT/$kind.txt)"; tail -25 "$OUT/$kind.txt"; status=1
  fi
done
{
  echo "# train_gpu at $REV, $(date -u +%Y-%m-%d)"
  echo
  echo "Command: \`DEV=$DEV K=$K ROW_SECONDS=$ROW_SECONDS SIZE=$SIZE KINDS=\"${KINDS:-image video}\" scripts/gpu_headline.sh\`"
  echo
  echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $(grep '^gpu:' "$OUT/machine.txt" || echo "no GPU")"
  echo
  echo "Each kind's table and ratios are in <kind>/train_device.md, its plot in <kind>.png, its rows in <kind>.json,"
  echo "its output in <kind>.txt (all but the plots in raw.tar.xz once packed)."
} >"$OUT/run.md"
for kind in ${KINDS:-image video}; do
  [[ -f $OUT/$kind/train_device.png ]] && mv "$OUT/$kind/train_device.png" "$OUT/$kind.png"
done
# A run folder under bench/results keeps README.md, summary.json, plots and raw.tar.xz.
if [[ $OUT == bench/results/* ]]; then "$PY" bench/pack_results.py "$OUT" || status=1; fi
echo "results in $OUT after $(($(date +%s) - START)) s"
exit $status
