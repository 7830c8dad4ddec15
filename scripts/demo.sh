#!/usr/bin/env bash
# `make demo`: the main job on a built-in default, after `make build`.
# Placeholder: runs the point-to-point benchmark of dlop-bench (subcommand in
# progress); the full demo is to come.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}
exec "$VENV/bin/dlop-bench" p2p "$@"
