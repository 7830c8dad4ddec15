#!/usr/bin/env bash
# Creates the Python virtual environment and keeps it current, doing nothing
# (and printing nothing) when it already is, so `make` runs it every time.
#
#   1. VENV (default .venv) is created with $PYTHON -m venv if it has no
#      working python.
#   2. requirements-dev.txt is installed into it when that file's content has
#      changed since the last install (or the venv is new).
#   3. dlop itself is installed editable, python part only, when pyproject.toml
#      has changed (or the venv is new). See pyproject.toml for why "python
#      part only": the C++ (executables, later dlop._C) is built by the
#      Makefile's own CMake build in build/, not a second time by pip.
#   4. scripts/venv_torchvision.py goes into its site-packages with a .pth
#      line importing it, so that scripts run in the venv can `import
#      torchvision` (PyPI's CUDA build, beside the CPU torch: see that file).
#
# Stamps: .stamps/<venv>.requirements and .stamps/<venv>.editable hold the
# sha256 of the inputs of steps 2 and 3.
#
# Usage: scripts/setup-python.sh [VENV]      Environment: PYTHON (python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${1:-.venv}
PYTHON=${PYTHON:-python3}
STAMPS=.stamps
py="$VENV/bin/python"
key=$(realpath -m "$VENV" | sed 's|^/||; s|[/ ]|_|g')
req_stamp="$STAMPS/$key.requirements"
edit_stamp="$STAMPS/$key.editable"

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off

# 1. The venv. A python that no longer starts (its base interpreter gone) means
#    a new venv.
if ! "$py" -c '' >/dev/null 2>&1; then
  echo "setup-python: creating $VENV with $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  rm -f "$req_stamp" "$edit_stamp"
fi

hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }
mkdir -p "$STAMPS"

# 2. Development requirements.
want=$(hash_of requirements-dev.txt)
if [[ "$(cat "$req_stamp" 2>/dev/null)" != "$want" ]]; then
  echo "setup-python: installing requirements-dev.txt into $VENV"
  "$py" -m pip install -r requirements-dev.txt
  echo "$want" >"$req_stamp"
  rm -f "$edit_stamp" # a new scikit-build-core may lay out the editable hook differently
fi

# 3. dlop, editable. --no-build-isolation: build with the venv's
#    scikit-build-core (and later its torch); --no-deps: requirements-dev.txt
#    already brought them, and nothing is resolved again.
want=$(hash_of pyproject.toml)
if [[ "$(cat "$edit_stamp" 2>/dev/null)" != "$want" ]]; then
  echo "setup-python: installing dlop (editable, python part only) into $VENV"
  "$py" -m pip install --no-build-isolation --no-deps \
    --config-settings=cmake.define.DLOP_PYTHON_ONLY=ON -e .
  echo "$want" >"$edit_stamp"
fi

# 4. torchvision importable beside the CPU torch: the shim and its .pth line,
#    rewritten only when they differ.
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if ! cmp -s scripts/venv_torchvision.py "$site/_dlop_venv_torchvision.py" ||
   [[ "$(cat "$site/_dlop_venv_torchvision.pth" 2>/dev/null)" != "import _dlop_venv_torchvision" ]]; then
  cp scripts/venv_torchvision.py "$site/_dlop_venv_torchvision.py"
  echo "import _dlop_venv_torchvision" >"$site/_dlop_venv_torchvision.pth"
fi
