#!/usr/bin/env bash
# Several hosts on this machine for benchmarks by hand (root):
#   scripts/netns-hosts.sh up N [RATE[,DELAY]]   # N namespaces dlhs-<i> at 10.214.0.<i+1>, device dl0
#   scripts/netns-hosts.sh down
#   scripts/netns-hosts.sh check                 # can namespaces be made here, and why not
# Run a rank in host i with: ip netns exec dlhs-<i> COMMAND (GLOO_SOCKET_IFNAME=dl0 for Gloo).
# A DELAY needs the kernel's netem qdisc; a RATE alone uses tbf.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
cd "$here"  # bench.netns is the benchmark lab's, importable from the repository root
exec "$python" -m bench.netns "$@"
