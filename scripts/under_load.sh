#!/usr/bin/env bash
# Runs a command beside N busy processes (a shell loop each, at normal priority), then, with the
# machine its own again, an optional second command:
#
#   scripts/under_load.sh N "command beside the load" ["command after it"]
#
# The busy processes are killed however the first command ends (exit, failure, Ctrl-C, TERM), and
# each also ends on its own once this script is gone (checked after each second or so of its own CPU
# time), so that not even a SIGKILLed run leaves a core spinning.
set -uo pipefail
n=$1; loaded=$2; after=${3:-}
pids=()
stop() {
  ((${#pids[@]})) || return 0
  kill "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
  echo "under-load: stopped the ${#pids[@]} busy processes"
  pids=()
}
trap stop EXIT
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
for ((k = 0; k < n; k++)); do
  bash -c 'while kill -0 "$1" 2>/dev/null; do for ((i = 0; i < 300000; i++)); do :; done; done' busy $$ &
  pids+=($!)
done
echo "under-load: ${#pids[@]} busy processes (pids ${pids[*]}) on $(nproc) cores, beside: $loaded"
bash -c "$loaded"; status=$?
stop
((status == 0)) || exit $status
[[ -z $after ]] || exec bash -c "$after"
