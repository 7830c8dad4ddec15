#!/usr/bin/env bash
# The quick loop: an incremental build, then the tests of what changed.
#
#   scripts/check.sh                 the layers touched since HEAD (changed, staged or new files)
#   scripts/check.sh scheduler       a layer: core transport collectives scheduler media offload backend
#                                    accelerator python report bench (C++ suites by ctest label, Python files)
#   scripts/check.sh tests/python/test_c10d_device.py -k ddp      pytest arguments
#   scripts/check.sh -R 'ReadyEvent' ctest arguments (a regex of test names)
#
# BUILD (default build) and VENV (default .venv) as for make; `make check T=...` calls it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${BUILD:-build}
PY=${VENV:-.venv}/bin/python

# Layer -> (ctest labels, pytest files). A layer's Python tests are those of
# the code it serves; C++ layers below the backend also run the backend's
# quickest end-to-end file.
declare -A LABELS=(
  [core]="core|transport|collectives|scheduler|media|offload" [transport]="transport"
  [collectives]="collectives" [scheduler]="scheduler" [media]="media|offload" [offload]="offload"
  [backend]="" [accelerator]="" [python]="" [report]="" [bench]="")
declare -A PYTESTS=(
  [core]="" [transport]="" [collectives]="" [scheduler]="tests/python/test_c10d_work.py"
  [media]="tests/python/test_offload_loader.py tests/python/test_offload_pipeline.py"
  [offload]="tests/python/test_offload_loader.py tests/python/test_offload_pipeline.py"
  [backend]="tests/python/test_c10d_reductions.py tests/python/test_c10d_work.py tests/python/test_c10d_device.py"
  [accelerator]="tests/python/test_test_accelerator.py tests/python/test_c10d_device.py"
  [python]="tests/python/test_package.py tests/python/test_cli.py tests/python/test_errors.py"
  [report]="tests/python/test_linearity.py tests/python/test_cli.py"
  [bench]="tests/bench/test_bench_smoke.py")

layer_of() {  # the layer a changed path belongs to (empty: none)
  case $1 in
    core/*) echo core ;; transport/*) echo transport ;; collectives/*) echo collectives ;;
    scheduler/*) echo scheduler ;; media/*) echo media ;; offload/*|python/dlop/data/*) echo offload ;;
    backend/test_accelerator/*|python/dlop/testing/*) echo accelerator ;;
    backend/*|python/dlop/c10d/*) echo backend ;;
    python/dlop/report/*) echo report ;; bench/*) echo bench ;; python/*) echo python ;;
    tests/python/*.py|tests/bench/*.py) echo "file:$1" ;;
  esac
}

cmake --build "$BUILD" -j"${JOBS:-2}"
cmake --install "$BUILD" --prefix "${VENV:-.venv}" --component bin >/dev/null

if (($# > 0)) && [[ $1 == -* && $1 != -k ]]; then
  exec ctest --test-dir "$BUILD" --output-on-failure -j"${JOBS:-2}" "$@"
fi
if (($# > 0)) && [[ -z ${LABELS[$1]+x} ]]; then
  exec "$PY" -m pytest -q "$@"
fi

layers=()
if (($# > 0)); then
  layers=("$@")
else
  while read -r path; do
    [[ -n $path ]] && layers+=("$(layer_of "$path")")
  done < <({ git diff --name-only HEAD; git ls-files --others --exclude-standard; } | sort -u)
fi
labels=(); files=()
for layer in "${layers[@]}"; do
  [[ -z $layer ]] && continue
  if [[ $layer == file:* ]]; then files+=("${layer#file:}"); continue; fi
  [[ -n ${LABELS[$layer]} ]] && labels+=("${LABELS[$layer]}")
  for f in ${PYTESTS[$layer]}; do files+=("$f"); done
done
if ((${#labels[@]} == 0 && ${#files[@]} == 0)); then
  echo "check: nothing changed that has tests (name a layer: ${!LABELS[*]})"
  exit 0
fi
if ((${#labels[@]} > 0)); then
  regex=$(IFS='|'; echo "${labels[*]}")
  echo "check: ctest -L '$regex'"
  ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -j"${JOBS:-2}" -L "^($regex)\$"
fi
if ((${#files[@]} > 0)); then
  mapfile -t unique < <(printf '%s\n' "${files[@]}" | sort -u)
  workers=()  # several files: one pytest worker per job, a file per worker (as make test-python)
  ((${#unique[@]} > 1)) && workers=(-n "${JOBS:-2}" --dist loadfile)
  echo "check: pytest ${workers[*]} ${unique[*]}"
  "$PY" -m pytest -q "${workers[@]}" "${unique[@]}"
fi
