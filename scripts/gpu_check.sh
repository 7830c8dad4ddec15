#!/usr/bin/env bash
# On a machine with NVIDIA GPUs, torch and NCCL (and no internet): confirms on
# CUDA what the test accelerator proves in CI, in about 5 minutes after the
# build. One command:
#
#   scripts/gpu_check.sh [OUT]          (OUT: where results go, default bench/results/gpu_check/<date>-<commit>)
#
# It builds dlop against the torch found there (with the Debian packages of
# .gpu_deps/, made here by scripts/gpu_deps.sh, where the machine lacks them;
# FFmpeg and the audio libraries among them, so the build has media),
# then runs:
#   0. a small all-reduce on CPU and on the device with UCX's lanes logged (smoke_*);
#   1. the device tests (tests/python/test_c10d_device.py) on the device,
#      staged (DLOP_DEVICE_BACKEND=staged), reduced in the memory of GPU 0
#      where ranks share it (auto, one GPU visible), and delegated to NCCL
#      (auto) where there are two GPUs or more;
#   2. bench.ddp_overlap: DDP's overlap efficiency, dlop (staged, then in
#      shared device memory) against Gloo, 2 ranks sharing GPU 0 (compute
#      alone, the step's all-reduces alone, the step, and per bucket when it
#      was computed and done);
#   3. bench.c10d on device tensors: 2 ranks on 2 GPUs against NCCL (where
#      there are two), and 2 ranks sharing GPU 0 against Gloo (in its memory);
#      bench.device (the staged 64 MiB all-reduce against its parts);
#   4. examples/imagenet_ddp.py (ResNet-50, synthetic images) with
#      --dist-backend dlop and nccl (two GPUs), or dlop and gloo (one GPU shared);
#   5. the same with DLOP_TRACE, summarised by `dlop report trace`: how long
#      each all-reduce waited for its copies and ran.
# Every output goes to OUT with the machine's description. Not part of `make test`.
#
# DEV=dlop_test rehearses the whole script here, on the test accelerator and
# the existing build, with small sizes (minutes on 2 cores).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
DEV=${DEV:-cuda}
OUT=${1:-bench/results/gpu_check/$(date -u +%Y-%m-%d)-$REV}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1

{
  echo "# gpu_check at $REV, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: scripts/gpu_check.sh $*"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 |
    sed 's/^/gpu: /'
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
                                "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)'
} | tee "$OUT/machine.txt"
START=$(date +%s)
if [[ $DEV == cuda ]]; then
  # --- dependencies and the build (exports what running dlop needs)
  source scripts/gpu_build.sh "$OUT" || exit 1
  GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  OVERLAP=(--width 1024 --layers 8 --batch 16384 --steps 10 --warmup 3)
  C10D_MAX=64M
  IMAGENET=(--arch resnet50 --batch-size 64 --steps 20 --epochs 1)
else
  GPUS=1  # a rehearsal: the test accelerator, its devices shared like one GPU
  OVERLAP=()
  C10D_MAX=1M
  IMAGENET=(--arch resnet18 --batch-size 2 --image-size 32 --classes 10 --steps 2 --epochs 1)
fi
echo "build done after $(($(date +%s) - START)) s"


status=0
run() {  # run NAME COMMAND...: its output to OUT/NAME.txt, and a line saying how it went
  local name=$1; shift
  echo "== $name: $*"
  if "$@" >"$OUT/$name.txt" 2>&1; then echo "   ok"; else echo "   FAILED (see $OUT/$name.txt)"; tail -15 "$OUT/$name.txt"; status=1; fi
}
TORCHRUN=("$PY" -m torch.distributed.run --nproc-per-node 2)
# Ranks sharing one device (auto: all-reduces in its memory).
SHARED=(CUDA_VISIBLE_DEVICES=0 DLOP_DEVICE_BACKEND=auto)
[[ $DEV == dlop_test ]] && SHARED+=(DLOP_TEST_DEVICE_COUNT=1)

# 0. smoke: one small all-reduce on CPU, then on CUDA, logging UCX's lanes, so
# a machine where nothing runs says why in a few seconds.
ucx_info -d >"$OUT/ucx_info.txt" 2>&1 || true
for dev in cpu "$DEV"; do
  impls=dlop,gloo; [[ $dev == dlop_test ]] && impls=dlop  # Gloo serves CPU and CUDA only
  run "smoke_$dev" timeout 120 env DLOP_LOG_LEVEL=info CUDA_VISIBLE_DEVICES=0 "${TORCHRUN[@]}" -m bench.c10d \
    --device "$dev" --impls "$impls" --ops all_reduce --sizes 8,1M -r 1
done

# 1. the device tests (stopping at the first failure, with its traceback)
export DLOP_TEST_ACCELERATOR=$DEV DLOP_TEST_TIMEOUT=120
PYTEST=("$PY" -m pytest -q -x -rfE --tb=short -p no:cacheprovider)
run tests_staged env DLOP_DEVICE_BACKEND=staged "${PYTEST[@]}" tests/python/test_c10d_device.py
run tests_shared env "${SHARED[@]}" "${PYTEST[@]}" tests/python/test_c10d_device.py
if ((GPUS >= 2)); then
  run tests_nccl env DLOP_DEVICE_BACKEND=auto "${PYTEST[@]}" tests/python/test_c10d_device.py -k "2ranks or ddp"
fi
unset DLOP_TEST_ACCELERATOR DLOP_TEST_TIMEOUT

# 2. how much of DDP's communication the backward pass hides, dlop against Gloo on one shared GPU
peers=dlop,gloo; [[ $DEV == dlop_test ]] && peers=dlop
run ddp_overlap env CUDA_VISIBLE_DEVICES=0 DLOP_DEVICE_BACKEND=staged "${TORCHRUN[@]}" -m bench.ddp_overlap \
  --device "$DEV" --backends "$peers" "${OVERLAP[@]}" --trace "$OUT/overlap_trace" --json "$OUT/ddp_overlap.json"
run ddp_overlap_shared env "${SHARED[@]}" "${TORCHRUN[@]}" -m bench.ddp_overlap \
  --device "$DEV" --backends "$peers" "${OVERLAP[@]}" --json "$OUT/ddp_overlap_shared.json"

# 3. collectives with the peers in the same run
if ((GPUS >= 2)); then
  run c10d_2gpus_nccl env DLOP_DEVICE_BACKEND=auto "${TORCHRUN[@]}" -m bench.c10d --device cuda \
    --impls dlop,nccl --ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast -e 256M \
    --json "$OUT/c10d_2gpus_nccl.json"
fi
run c10d_shared_gpu_gloo env "${SHARED[@]}" "${TORCHRUN[@]}" -m bench.c10d \
  --device "$DEV" --impls "$peers" --ops all_reduce,broadcast -e "$C10D_MAX" --json "$OUT/c10d_shared_gpu_gloo.json"
run device_staging env CUDA_VISIBLE_DEVICES=0 DLOP_DEVICE_BACKEND=staged "${TORCHRUN[@]}" -m bench.device --device "$DEV" -r 3 \
  --small-iters 200 --json "$OUT/device_staging.json"

# 4. a DDP ImageNet-style run, dlop against the device's own backend
if ((GPUS >= 2)); then peer=nccl; vis=(CUDA_VISIBLE_DEVICES=0,1); else peer=gloo; vis=("${SHARED[@]}"); fi
[[ $DEV == dlop_test ]] && peer=
for backend in dlop $peer; do
  run "imagenet_ddp_$backend" env "${vis[@]}" "${TORCHRUN[@]}" examples/imagenet_ddp.py \
    --dist-backend "$backend" --device "$DEV" "${IMAGENET[@]}"
done

# 5. when each of a staged DDP step's all-reduces waited for its copies and ran (dlop report trace)
run imagenet_ddp_dlop_traced env "${vis[@]}" DLOP_TRACE="$OUT/trace" DLOP_DEVICE_BACKEND=staged "${TORCHRUN[@]}" \
  examples/imagenet_ddp.py --dist-backend dlop --device "$DEV" "${IMAGENET[@]}"
run trace_summary "$PY" -m dlop.report.trace "$OUT/trace" --json "$OUT/trace_summary.json"

echo "took $(($(date +%s) - START)) s in all"
# A run folder under bench/results keeps README.md (command, machine, each
# step's outcome; the figures go in by hand), summary.json, plots and raw.tar.xz.
if [[ $OUT == bench/results/* ]]; then
  {
    echo "# gpu_check, $(date -u +%Y-%m-%d), $REV"
    echo
    echo "Command: \`scripts/gpu_check.sh $*\`"
    echo
    echo "Machine: $(grep -E '^(cpu|gpu|torch)' "$OUT/machine.txt" | paste -sd ';' -)"
    echo
    echo "Steps:"
    grep -E '^(== |   (ok|FAILED))' "$OUT/gpu_check.log" | paste - - | sed -E 's/^== ([^:]*):.*\t +/- \1: /'
  } >"$OUT/README.md"
  "$PY" bench/pack_results.py "$OUT" || status=1
fi
echo "results in $OUT"
exit $status
