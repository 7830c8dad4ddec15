#!/usr/bin/env bash
# `make demo`: the main job on a built-in default, after `make build`.
# For now dlop is its transport layer: a two-process ping-pong (latency and
# bandwidth by size) and a four-process all-to-all of messages, both over UCX
# with ranks forked on this host, contents checked.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bench=${VENV:-.venv}/bin/dlop-bench
"$bench" p2p --local 2 -b 8 -e 64M -f 4 -r 5
echo
"$bench" exchange --local 4 -b 8 -e 1M -f 8 -r 5
