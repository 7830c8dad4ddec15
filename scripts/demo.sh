#!/usr/bin/env bash
# `make demo`: the main job on a built-in default, after `make build`.
# 1. An unmodified DDP script (examples/ddp_train.py, built-in synthetic data)
#    trained on 2 ranks under torchrun with backend "dlop", then the same with
#    Gloo, each printing loss, accuracy and samples/s.
# 2. dlop's all-reduce against Open MPI's on the same buffers (nccl-tests
#    table), 2 ranks under mpirun.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=${VENV:-.venv}
export OMP_NUM_THREADS=1
for backend in dlop gloo; do
  echo "== DDP training, 2 ranks, backend $backend"
  "$venv/bin/torchrun" --standalone --nproc-per-node 2 examples/ddp_train.py --dist-backend "$backend" --epochs 3
  echo
done
echo "== all-reduce, 2 ranks: dlop and Open MPI on the same buffers"
mpirun_args=(--oversubscribe -np 2)
[[ $(id -u) == 0 ]] && mpirun_args=(--allow-run-as-root "${mpirun_args[@]}")
mpirun "${mpirun_args[@]}" "$venv/bin/dlop-bench" allreduce -b 8 -e 64M -f 8
