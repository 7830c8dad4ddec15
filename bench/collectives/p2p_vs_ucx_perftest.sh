#!/usr/bin/env bash
# dlop's transport against raw UCX on this machine, in one run: ucx_perftest
# tag_lat / tag_bw and dlop-bench p2p at 8 B (latency), 1 MiB and 64 MiB
# (bandwidth), with shared memory (UCX's default choice) and with UCX_TLS=tcp.
# Each figure is the median of ROUNDS alternating runs of both tools.
#
#   bench/collectives/p2p_vs_ucx_perftest.sh [ROUNDS] [OUT.json]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
out=${2:-}
bench=${DLOP_BENCH:-.venv/bin/dlop-bench}
[ -x "$bench" ] || bench=build/bench/dlop-bench
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (Debian package ucx-utils)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=$((20000 + RANDOM % 20000))

# One ucx_perftest measurement: prints the median latency (us) for tag_lat,
# or the overall bandwidth (GB/s, decimal) for tag_bw.
perftest() {  # test size iterations
  port=$((port + 1))
  ucx_perftest -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.3
  local line
  line=$(ucx_perftest 127.0.0.1 -p "$port" -t "$1" -s "$2" -n "$3" 2>/dev/null | grep '^Final:')
  wait "$server" || true
  # Final: iterations  lat-50%  lat-avg  lat-overall  bw-avg(MiB/s)  bw-overall(MiB/s) ...
  if [ "$1" = tag_lat ]; then awk '{print $3}' <<<"$line"; else awk '{printf "%.4f\n", $7 * 1048576 / 1e9}' <<<"$line"; fi
}

# One dlop-bench p2p row: latency (us) or bandwidth (GB/s) at a size.
dlop() {  # latency|bandwidth size
  "$bench" p2p --local 2 -b "$2" -e "$2" -r 9 --json "$tmp/p2p.json" >/dev/null
  python3 -c "import json,sys; r=json.load(open('$tmp/p2p.json'))['rows'][0]; print('%.3f' % r['latency_us'] if sys.argv[1]=='latency' else '%.4f' % r['bandwidth_gbps'])" "$1"
}

median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

printf '# dlop transport vs ucx_perftest, median of %s alternating rounds (%s)\n' "$rounds" "$(ucx_info -v | head -1 | sed 's/# //')"
printf '%-8s %-22s %12s %12s %8s %8s\n' transport figure ucx_perftest dlop ratio target
rows=()
for tls in default tcp; do
  if [ "$tls" = tcp ]; then export UCX_TLS=tcp; else unset UCX_TLS; fi
  for case in "latency 8 tag_lat 200000" "bandwidth 1048576 tag_bw 4000" "bandwidth 67108864 tag_bw 100"; do
    read -r kind size test iters <<<"$case"
    : >"$tmp/ucx"; : >"$tmp/dlop"
    for _ in $(seq "$rounds"); do
      perftest "$test" "$size" "$iters" >>"$tmp/ucx"
      dlop "$kind" "$size" >>"$tmp/dlop"
    done
    u=$(median <"$tmp/ucx"); d=$(median <"$tmp/dlop")
    if [ "$kind" = latency ]; then
      ratio=$(awk -v d="$d" -v u="$u" 'BEGIN{printf "%.2f", d/u}'); target="<=1.05"; unit=us
    else
      ratio=$(awk -v d="$d" -v u="$u" 'BEGIN{printf "%.2f", d/u}'); target=">=1.00"; unit=GB/s
    fi
    printf '%-8s %-22s %12s %12s %8s %8s\n' "$tls" "$kind $size B ($unit)" "$u" "$d" "$ratio" "$target"
    rows+=("{\"transport\":\"$tls\",\"figure\":\"$kind\",\"bytes\":$size,\"ucx_perftest\":$u,\"dlop\":$d,\"ratio\":$ratio}")
  done
done
if [ -n "$out" ]; then
  (IFS=,; printf '[%s]\n' "${rows[*]}") >"$out"
  echo "# written to $out"
fi
