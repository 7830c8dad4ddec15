#!/usr/bin/env bash
# On a machine with NVIDIA GPUs, torch and NCCL (and no internet): confirms on
# CUDA what the test accelerator proves in CI. Two commands, each planned for
# at most 8 minutes with the build (scripts/gpu_plan.md has the whole visit):
#
#   scripts/gpu_check.sh ddp "$OUT"     the DDP step on one GPU shared by two ranks
#   scripts/gpu_check.sh tests "$OUT"   the device tests and the collective benchmarks
#
# Each starts with a preflight (scripts/gpu_preflight.py, at most 15 s, naming
# every missing piece: torch and CUDA, nvidia-smi, /dev/shm, ptrace for CUDA
# IPC), builds dlop against the torch found there (scripts/gpu_build.sh, with
# the carried .gpu_deps/; incremental on a machine that kept build-gpu/), and
# checks the clock before each step (scripts/gpu_lib.sh): steps that would end
# past GPU_BUDGET seconds (default 480) are skipped, and README.md names them.
# The run is packed into OUT as bench/results/ keeps it (README.md,
# summary.json, raw.tar.xz); OUT defaults to
# bench/results/gpu_check[_tests]/<date>-<commit>.
#
# Every step on the shared path runs with DLOP_DEVICE_BACKEND=shared, which
# fails a group whose handle exchange fails instead of staging, and asserts
# that the ranks' groups reduced in the device's memory (pg.shared_device:
# scripts/gpu_shared_probe.py; the group's log line, or ddp_overlap's
# device_path, in the other steps).
#
# ddp, in order of what a short visit must not miss:
#   smoke_cpu, smoke_DEV   one small all-reduce, UCX's lanes logged;
#   shared_probe           pg.shared_device on each of 2 ranks sharing GPU 0;
#   ddp_staged, ddp_gloo, ddp_staged_traced, ddp_shared, trace_summary:
#                          examples/imagenet_ddp.py (ResNet-50, synthetic images)
#                          on the same single GPU, dlop staged (the 0.66x case)
#                          against Gloo, then staged with DLOP_TRACE (summarised by
#                          dlop.report.trace: when each all-reduce waited for its
#                          copies and ran), then in shared device memory;
#                          ddp_vs_gloo.json holds the images/s and the ratios;
#   overlap_staged, overlap_shared: bench.ddp_overlap, dlop against Gloo.
# tests:
#   tests_shared: tests/python/test_c10d_device.py in shared device memory;
#   c10d_shared_gpu_gloo; device_staging (bench.device); tests_staged; and
#   with two GPUs or more tests_nccl and c10d_2gpus_nccl.
#
# DEV=dlop_test rehearses either part here, on the test accelerator and the
# existing build, with small sizes (no Gloo: it cannot serve dlop_test).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PY=${PYTHON:-python3}
DEV=${DEV:-cuda}
PART=${1:-}
[[ $PART == ddp || $PART == tests ]] || { echo "usage: scripts/gpu_check.sh ddp|tests [OUT]" >&2; exit 2; }
BENCH=gpu_check; [[ $PART == tests ]] && BENCH=gpu_check_tests
source scripts/gpu_lib.sh
REV=$(git rev-parse --short HEAD 2>/dev/null || cat .gpu_data/rev 2>/dev/null || echo unknown)
gpu_begin "$BENCH" "${2:-bench/results/$BENCH/$(date -u +%Y-%m-%d)-$REV}"
GPU_DROP="raw/trace/* raw/overlap_trace/*"  # dropped only where the pack would not come back whole
gpu_machine "DEV=$DEV GPU_BUDGET=$BUDGET scripts/gpu_check.sh $PART OUT"

gpu_readme() {
  gpu_readme_head "scripts/gpu_check.sh $PART on $DEV"
  [[ -s $WORK/notes.txt ]] && { echo; sed 's/^/- /' "$WORK/notes.txt"; }
  echo
  echo "## Steps"
  echo
  gpu_steps_md
}

# --- preflight, then the build
need=torch,shm,cores
[[ $DEV == cuda ]] && need+=,nvidia-smi,disk,ptrace
gpu_preflight --need "$need" --min-cores 2
if [[ $DEV == cuda ]]; then
  gpu_build
  GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  OVERLAP=(--width 1024 --layers 8 --batch 16384 --steps 10 --warmup 3)
  C10D=(-e 64M)
  IMAGENET=(--arch resnet50 --batch-size 64 --steps 20 --epochs 3)
  EST_RUN=45 EST_TESTS=150
else
  GPUS=1  # a rehearsal: the test accelerator, its devices shared like one GPU
  OVERLAP=()
  C10D=(-e 64K -f 8 -n 5 -w 1)  # each call on the shared test device takes 1-3 ms of the 2 cores
  IMAGENET=(--arch resnet18 --batch-size 2 --image-size 32 --classes 10 --steps 2 --epochs 2)
  EST_RUN=30 EST_TESTS=240
fi
TORCHRUN=("$PY" -m torch.distributed.run --nproc-per-node 2)
# Ranks sharing one device, reducing in its memory or failing.
SHARED=(CUDA_VISIBLE_DEVICES=0 DLOP_DEVICE_BACKEND=shared DLOP_LOG_LEVEL=info)
[[ $DEV == dlop_test ]] && SHARED+=(DLOP_TEST_DEVICE_COUNT=1)
peers=dlop,gloo; [[ $DEV == dlop_test ]] && peers=dlop  # Gloo serves CPU and CUDA only

# assert_shared NAME: both ranks' groups of step NAME logged that they reduce in the device's memory.
assert_shared() {
  local got; got=$(grep -c 'all-reduces reduce in its memory' "$WORK/$1.txt" 2>/dev/null)
  if ((${got:-0} >= 2)) && ! grep -q 'are staged:' "$WORK/$1.txt"; then
    echo "   shared device memory: $got groups said so"
  else
    echo "   NOT SHARED: $1's ranks did not all reduce in device memory (${got:-0} log lines)"
    printf '%s\tFAILED\t0\tthe ranks did not all reduce in device memory\n' "$1-shared" >>"$WORK/steps.tsv"
    STATUS=1
  fi
}

if [[ $PART == ddp ]]; then
  for dev in cpu "$DEV"; do
    impls=dlop,gloo; [[ $dev == dlop_test ]] && impls=dlop
    gpu_step "smoke_$dev" 30 env DLOP_LOG_LEVEL=info CUDA_VISIBLE_DEVICES=0 "${TORCHRUN[@]}" -m bench.c10d \
      --device "$dev" --impls "$impls" --ops all_reduce --sizes 8,1M -r 1
  done
  gpu_step shared_probe 30 env "${SHARED[@]}" "${TORCHRUN[@]}" scripts/gpu_shared_probe.py --device "$DEV" &&
    cat "$WORK/shared_probe.txt" | grep '^rank .*shared_device'

  # The staged DDP step against Gloo on the same single GPU (0.66-0.69x on an H100 at 55294a6), with its trace.
  run_ddp() {  # run_ddp NAME BACKEND ENV...
    local name=$1 backend=$2; shift 2
    gpu_step "$name" "$EST_RUN" env CUDA_VISIBLE_DEVICES=0 "$@" "${TORCHRUN[@]}" examples/imagenet_ddp.py \
      --dist-backend "$backend" --device "$DEV" "${IMAGENET[@]}" && grep -h 'images/s' "$WORK/$name.txt" | tail -1
  }
  run_ddp ddp_staged dlop DLOP_DEVICE_BACKEND=staged
  [[ $DEV == cuda ]] && run_ddp ddp_gloo gloo
  run_ddp ddp_staged_traced dlop DLOP_DEVICE_BACKEND=staged DLOP_TRACE="$WORK/raw/trace"
  run_ddp ddp_shared dlop "${SHARED[@]}" && assert_shared ddp_shared
  [[ -d $WORK/raw/trace ]] && gpu_step trace_summary 15 "$PY" -m dlop.report.trace "$WORK/raw/trace" \
    --json "$WORK/trace_summary.json" && head -20 "$WORK/trace_summary.txt"
  gpu_step ddp_vs_gloo 10 "$PY" scripts/gpu_ddp_summary.py ddp-vs-gloo "$WORK" && cat "$WORK/ddp_vs_gloo.txt"

  gpu_step overlap_staged 60 env CUDA_VISIBLE_DEVICES=0 DLOP_DEVICE_BACKEND=staged "${TORCHRUN[@]}" \
    -m bench.ddp_overlap --device "$DEV" --backends "$peers" "${OVERLAP[@]}" --trace "$WORK/raw/overlap_trace" \
    --json "$WORK/ddp_overlap.json"
  if gpu_step overlap_shared 60 env "${SHARED[@]}" "${TORCHRUN[@]}" -m bench.ddp_overlap \
      --device "$DEV" --backends "$peers" "${OVERLAP[@]}" --json "$WORK/ddp_overlap_shared.json"; then
    assert_shared overlap_shared
    "$PY" scripts/gpu_ddp_summary.py device-path "$WORK/ddp_overlap_shared.json" ||
      { printf 'overlap_shared-path\tFAILED\t0\tdevice_path is not shared\n' >>"$WORK/steps.tsv"; STATUS=1; }
  fi
else
  # What is new on the shared path first; the staged tests passed on an H100 at 55294a6 (39 passed).
  export DLOP_TEST_ACCELERATOR=$DEV DLOP_TEST_TIMEOUT=120
  PYTEST=("$PY" -m pytest -q -x -rfE --tb=short -p no:cacheprovider)
  gpu_step tests_shared "$EST_TESTS" env "${SHARED[@]}" "${PYTEST[@]}" tests/python/test_c10d_device.py
  gpu_step c10d_shared_gpu_gloo 60 env "${SHARED[@]}" "${TORCHRUN[@]}" -m bench.c10d --device "$DEV" \
    --impls "$peers" --ops all_reduce,broadcast "${C10D[@]}" --json "$WORK/c10d_shared_gpu_gloo.json" &&
    assert_shared c10d_shared_gpu_gloo
  gpu_step device_staging 40 env CUDA_VISIBLE_DEVICES=0 DLOP_DEVICE_BACKEND=staged "${TORCHRUN[@]}" -m bench.device \
    --device "$DEV" -r 3 --small-iters 200 --json "$WORK/device_staging.json"
  gpu_step tests_staged "$EST_TESTS" env DLOP_DEVICE_BACKEND=staged "${PYTEST[@]}" tests/python/test_c10d_device.py
  ((GPUS >= 2)) && gpu_step tests_nccl "$EST_TESTS" env DLOP_DEVICE_BACKEND=auto "${PYTEST[@]}" \
    tests/python/test_c10d_device.py -k "2ranks or ddp"
  ((GPUS >= 2)) && gpu_step c10d_2gpus_nccl 60 env DLOP_DEVICE_BACKEND=auto "${TORCHRUN[@]}" -m bench.c10d \
    --device cuda --impls dlop,nccl --ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast -e 256M \
    --json "$WORK/c10d_2gpus_nccl.json"
  unset DLOP_TEST_ACCELERATOR DLOP_TEST_TIMEOUT
fi
gpu_finish
