#!/usr/bin/env bash
# More ranks than cores: dlop against Open MPI (dlop-bench under
# `mpirun --oversubscribe`, both in the same run on the same buffers) at 2, 3,
# 4 and 8 ranks on this machine, and against Gloo through torch.distributed
# (torchrun, bench.c10d) at 4 ranks, with torch's do-nothing backend as
# the floor. Then all-reduce and DDP beside busy intra-op threads, and the CPU an
# idle engine uses.
# Each run goes to <name>.{txt,json} in the run folder
# bench/results/oversubscribe/<UTC date>-<short commit>/ (or $DLOP_OUT), with its
# README.md (date, commit, machine, command); each .txt starts with the command
# that made it and the machine's load. At the end bench/common/pack_results.py packs
# the folder (README.md, summary.json, raw.tar.xz).
#
#   bench/collectives/run_oversubscribe.sh [RANKS...]     default: 2 3 4 8
# DLOP_RUNS=N repeats each (files _run<k>, then _median.txt per rank count).
set -euo pipefail
cd "$(dirname "$0")/../.."
bench=${DLOP_BENCH:-build/bench/dlop-bench}
[ -x "$bench" ] || bench=.venv/bin/dlop-bench
[ -x "$bench" ] || { echo "dlop-bench not found: build it, or set DLOP_BENCH" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "mpirun not found" >&2; exit 1; }
python=${PYTHON:-.venv/bin/python}
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 3 4 8)
. bench/common/run_folder.sh
run_folder oversubscribe "More ranks than cores: dlop vs Open MPI and Gloo" \
  "${DLOP_RUNS:+DLOP_RUNS=$DLOP_RUNS }bench/collectives/run_oversubscribe.sh ${ranks[*]}"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
runs=${DLOP_RUNS:-1}

header() { echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"; }

for n in "${ranks[@]}"; do
  for part in small large; do
    case $part in
      small) sizes=(-b 8 -e 32K -f 8 --reps 5) ;;
      large) sizes=(-b 64M -e 64M --reps 3) ;;
    esac
    jsons=()
    for ((k = 1; k <= runs; k++)); do
      base=$out/allreduce_${n}ranks_$part
      [ "$runs" -gt 1 ] && base=${base}_run$k
      cmd=(mpirun "${root[@]}" --oversubscribe -np "$n" "$bench" allreduce "${sizes[@]}" -d float -o sum --inplace 1
           --json "$base.json")
      { header; echo "# ${cmd[*]}"; "${cmd[@]}" 2>&1; } | tee "$base.txt"
      jsons+=("$base.json")
    done
    if [ "$runs" -gt 1 ]; then
      "$python" bench/common/median_of_runs.py "${jsons[@]}" | tee "$out/allreduce_${n}ranks_${part}_median.txt"
    fi
  done
done

# Through torch: 4 ranks on this machine's cores, dlop and Gloo in one run.
port=$((29500 + RANDOM % 1000))
cmd=("$python" -m torch.distributed.run --nproc-per-node 4 --master-port "$port" -m bench.c10d
     --ops all_reduce --sizes 8,4K,64K --impls dlop,gloo,fake -r 5 --json "$out/c10d_4ranks.json")
{ header; echo "# OMP_NUM_THREADS=1 ${cmd[*]}"; OMP_NUM_THREADS=1 "${cmd[@]}" 2>&1 | grep -v '^W[0-9]'; } | tee "$out/c10d_4ranks.txt"

# Busy cores: 2 ranks whose torch intra-op threads use every core, as in CPU
# DDP; all-reduce latency beside them, then DDP throughput, with dlop's
# automatic wait policy and with DLOP_PROGRESS=spin, against Gloo.
"$python" -m bench.busy_cores | tee "$out/busy_cores.txt"
for mode in auto spin; do
  { header; echo "# DLOP_PROGRESS=$mode python -m bench.ddp --ranks 2 --threads $(nproc) --backends dlop,gloo --models transformer,resnet18";
    DLOP_PROGRESS=$mode "$python" -m bench.ddp --ranks 2 --threads "$(nproc)" --backends dlop,gloo \
      --models transformer,resnet18 --no-progress --json "$out/ddp_busy_cores_$mode.json" 2>&1 | grep -v '^\['; } |
    tee "$out/ddp_busy_cores_$mode.txt"
done

# An idle engine: 2 ranks that made one all-reduce, then wait 10 s on a
# barrier of the bootstrap (not the engine); CPU seconds each used meanwhile.
"$python" -m bench.idle_cpu | tee "$out/idle_cpu.txt"

# The run folder as bench/results keeps it: README.md, summary.json, raw.tar.xz.
pack_run_folder
