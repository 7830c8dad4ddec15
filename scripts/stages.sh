#!/usr/bin/env bash
# Runs named stages in order, stopping at the first that fails, and prints
# each stage's wall time at the end (also after a failure), e.g.
#
#   scripts/stages.sh test "build:make build" "C++ tests:make test-cpp"
#
# The first argument names the whole (for the summary's title).
set -uo pipefail
title=$1; shift
names=(); seconds=(); results=()
status=0
for stage in "$@"; do
  name=${stage%%:*}; command=${stage#*:}
  start=$(date +%s)
  bash -c "$command"; status=$?
  names+=("$name"); seconds+=($(( $(date +%s) - start ))); results+=($([[ $status == 0 ]] && echo ok || echo FAILED))
  ((status == 0)) || break
done
total=0
echo
echo "make $title: stage times"
for i in "${!names[@]}"; do
  printf '  %-16s %4dm%02ds  %s\n' "${names[$i]}" $((seconds[i] / 60)) $((seconds[i] % 60)) "${results[$i]}"
  total=$((total + seconds[i]))
done
printf '  %-16s %4dm%02ds\n' total $((total / 60)) $((total % 60))
exit $status
