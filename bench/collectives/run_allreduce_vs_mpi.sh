#!/usr/bin/env bash
# dlop's all-reduce against Open MPI's own MPI_Allreduce, in the same run on
# the same buffers: 2 ranks, float sum, 8 B to 256 MiB (factor 4), under each
# of Open MPI's configurations on one host:
#   default  what this Open MPI picks by itself (Debian's: pml ob1, btl vader)
#   ob1      --mca pml ob1 --mca btl self,vader
#   ucx      --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any
# Writes <config>.{txt,json} into the run folder
# bench/results/allreduce_vs_mpi/<UTC date>-<short commit>/ (or $DLOP_OUT), with
# its README.md (date, commit, machine, command); each .txt starts with the
# command line that made it. At the end bench/common/pack_results.py packs the folder
# (README.md, summary.json, raw.tar.xz).
#
#   bench/collectives/run_allreduce_vs_mpi.sh [CONFIG...] [-- EXTRA dlop-bench OPTIONS]
#   e.g. bench/collectives/run_allreduce_vs_mpi.sh ucx -- -e 1M --reps 9
# DLOP_RUNS=N repeats each configuration N times (files <config>_run<k>) and
# then writes <config>_median.txt: per row, the median over runs of each time
# and of each run's own dlop/MPI ratio (bench/common/median_of_runs.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
bench=${DLOP_BENCH:-build/bench/dlop-bench}
[ -x "$bench" ] || bench=.venv/bin/dlop-bench
[ -x "$bench" ] || { echo "dlop-bench not found: build it, or set DLOP_BENCH" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "mpirun not found" >&2; exit 1; }

configs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do configs+=("$1"); shift; done
[ $# -gt 0 ] && shift  # the --
[ ${#configs[@]} -gt 0 ] || configs=(default ob1 ucx)

mpirun_args=(-np 2)
[ "$(id -u)" = 0 ] && mpirun_args+=(--allow-run-as-root)
. bench/common/run_folder.sh
run_folder allreduce_vs_mpi "All-reduce vs Open MPI, 2 ranks" \
  "${DLOP_RUNS:+DLOP_RUNS=$DLOP_RUNS }bench/collectives/run_allreduce_vs_mpi.sh ${configs[*]}${*:+ -- $*}"

for config in "${configs[@]}"; do
  case "$config" in
    default) mca=() ;;
    ob1) mca=(--mca pml ob1 --mca btl self,vader) ;;
    ucx) mca=(--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any) ;;
    *) echo "unknown configuration '$config' (default, ob1, ucx)" >&2; exit 1 ;;
  esac
  runs=${DLOP_RUNS:-1}
  jsons=()
  for ((k = 1; k <= runs; k++)); do
    base=$out/$config
    [ "$runs" -gt 1 ] && base=${base}_run$k
    cmd=(mpirun "${mpirun_args[@]}" "${mca[@]}" "$bench" allreduce -b 8 -e 256M -f 4 -d float -o sum
         --json "$base.json" "$@")
    {
      echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
      echo "# ${cmd[*]}"
      "${cmd[@]}" 2>&1
    } | tee "$base.txt"
    echo "# written to $base.txt and $base.json"
    jsons+=("$base.json")
  done
  if [ "$runs" -gt 1 ]; then
    python3 bench/common/median_of_runs.py "${jsons[@]}" | tee "$out/${config}_median.txt"
  fi
done

# The run folder as bench/results keeps it: README.md, summary.json, raw.tar.xz.
pack_run_folder
