#!/usr/bin/env bash
# `make demo`: the main job on a built-in default, after `make build`.
# 1. An unmodified DDP script (examples/ddp_train.py, built-in synthetic data)
#    trained on 2 ranks under torchrun with backend "dlop", then the same with
#    Gloo, each printing loss, accuracy and samples/s. Gloo is the peer: if its
#    run fails, the demo says how and goes on; its exit status is dlop's runs'.
# 2. Offloaded preprocessing: a small CNN trained on the built-in synthetic
#    image folder (`dlop make-dataset`) by 2 trainer ranks (backend dlop), its
#    batches made by 2 local dlop-offloader daemons, then the same training
#    with a local torch DataLoader; both samples/s and their ratio.
#    Then video: a small 3D CNN on the built-in video set (`dlop make-dataset
#    --kind video`), its clips decoded and augmented by the same daemons.
# 3. dlop's all-reduce against Open MPI's on the same buffers (nccl-tests
#    table), 2 ranks under mpirun.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=${VENV:-.venv}
export OMP_NUM_THREADS=1
work=$(mktemp -d)
daemons=()
cleanup() { for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
ddp=("$venv/bin/torchrun" --standalone --nproc-per-node 2 examples/ddp_train.py --epochs 3)
echo "== DDP training, 2 ranks, backend dlop"
"${ddp[@]}" --dist-backend dlop
echo
echo "== DDP training, 2 ranks, backend gloo (the peer dlop is compared with)"
peer_failed=""
if ! "${ddp[@]}" --dist-backend gloo 2>&1 | tee "$work/gloo.log"; then
  status=${PIPESTATUS[0]}
  # torchrun's summary names the failed rank and its exit code or signal; the rank's own last words say why.
  how=$(grep -E "terminate called|exitcode|Signal [0-9]+ \(|Error:" "$work/gloo.log" | sed 's/^[[:space:]]*//' |
    sort -u | head -4 | paste -sd ";" - || true)
  peer_failed="the Gloo comparison run failed (torchrun exit status $status: ${how:-see its output above})"
  echo "== NOTE: $peer_failed."
  echo "== This is the peer's run, not dlop's: the demo goes on, and its exit status is that of dlop's runs."
fi
echo
data=${DLOP_DEMO_DATA:-${XDG_CACHE_HOME:-$HOME/.cache}/dlop/demo-images}
[[ -f $data/.complete ]] || { rm -rf "$data" && "$venv/bin/dlop" make-dataset "$data" --classes 10 --per-class 32 && touch "$data/.complete"; }
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token"
chmod 600 "$work/token"
addresses=()
for k in 1 2; do
  "$venv/bin/dlop-offloader" --listen 127.0.0.1:0 --token-file "$work/token" --threads 1 > "$work/daemon$k.log" 2>&1 &
  daemons+=($!)
  for _ in $(seq 100); do grep -q "listening on" "$work/daemon$k.log" && break; sleep 0.1; done
  addresses+=("127.0.0.1:$(grep -m1 "listening on" "$work/daemon$k.log" | sed 's/.*://')")
done
offloaders=$(IFS=,; echo "${addresses[*]}")
train=("$venv/bin/torchrun" --standalone --nproc-per-node 2 examples/offload_train.py --data "$data" --epochs 2)
echo "== offloaded preprocessing: 2 trainer ranks (dlop), batches from 2 dlop-offloader daemons ($offloaders)"
DLOP_OFFLOAD_TOKEN=$(cat "$work/token") "${train[@]}" --offloaders "$offloaders" | tee "$work/offloaded.log"
echo
echo "== the same training, batches from a local torch DataLoader (1 worker per rank)"
"${train[@]}" --local-dataloader | tee "$work/local.log"
rate() { grep "^epoch" "$1" | tail -1 | sed 's/.* \([0-9.]*\) samples\/s/\1/'; }
echo "== last epoch: offloaded $(rate "$work/offloaded.log") samples/s, local DataLoader $(rate "$work/local.log") samples/s," \
  "ratio $(python3 -c "print(f'{$(rate "$work/offloaded.log") / $(rate "$work/local.log"):.2f}')")"
echo
videos=${DLOP_DEMO_VIDEOS:-${XDG_CACHE_HOME:-$HOME/.cache}/dlop/demo-videos}
[[ -f $videos/.complete ]] || { rm -rf "$videos" && "$venv/bin/dlop" make-dataset --kind video "$videos" --classes 4 --per-class 8 && touch "$videos/.complete"; }
echo "== offloaded video: a 3D CNN on 2 trainer ranks (dlop), 8-frame clips decoded by the same daemons"
DLOP_OFFLOAD_TOKEN=$(cat "$work/token") "$venv/bin/torchrun" --standalone --nproc-per-node 2 \
  examples/offload_video_train.py --data "$videos" --offloaders "$offloaders" --epochs 2
echo

echo "== all-reduce, 2 ranks: dlop and Open MPI on the same buffers"
mpirun_args=(--oversubscribe -np 2)
[[ $(id -u) == 0 ]] && mpirun_args=(--allow-run-as-root "${mpirun_args[@]}")
mpirun "${mpirun_args[@]}" "$venv/bin/dlop-bench" allreduce -b 8 -e 64M -f 8
[[ -z $peer_failed ]] || echo "== demo done: dlop's runs succeeded; $peer_failed"
