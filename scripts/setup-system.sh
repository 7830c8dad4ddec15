#!/usr/bin/env bash
# Installs the Debian packages that dlop builds and tests with, and only those
# that are missing: when everything is there it prints nothing and takes a few
# milliseconds (one dpkg-query), so `make` runs it every time.
#
# Usage: scripts/setup-system.sh        (as root, or through sudo otherwise)
# Environment: DLOP_SKIP_SYSTEM=1 skips it (a non-Debian system with the
# equivalents installed by hand).
set -euo pipefail

PACKAGES=(
  cmake ninja-build g++ pkg-config
  libucx-dev ucx-utils
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev libspdlog-dev libcli11-dev nlohmann-json3-dev
  # media/: JPEG and PNG decoding; zlib for record-file checksums.
  libjpeg62-turbo-dev libpng-dev zlib1g-dev
  # dlop-offloader: libcrypto (HMAC-SHA256); clang and its runtimes (libFuzzer,
  # ASan; only recommended by clang, so not pulled in) for the protocol's fuzzer.
  libssl-dev clang libclang-rt-14-dev
  # media/: video (FFmpeg's libraries) and audio (libsndfile, soxr, kissfft);
  # ffmpeg and espeak-ng make the built-in synthetic video and speech sets.
  libavformat-dev libavcodec-dev libavutil-dev libswscale-dev ffmpeg
  libsndfile1-dev libsoxr-dev libkissfft-dev espeak-ng
  # ip and tc: the tests' hosts as network namespaces joined by veth and a bridge.
  iproute2
  # media/: record files and WebDataset shards from S3-compatible stores and
  # HTTP(S) (libcurl, with its SigV4 signing); nginx serves shards to the tests.
  libcurl4-openssl-dev nginx
  # A real SLURM cluster of namespace nodes for the fleet tests (no systemd:
  # the tests start munged, slurmctld and slurmd themselves).
  slurmctld slurmd slurm-client munge
  # promtool runs the Kubernetes autoscalers' PromQL query over real series
  # (tests/python/test_kubernetes_autoscale.py); no server is started.
  prometheus
  python3-venv
  # Python.h for the dlop._C extension when the venv's Python is Debian's own.
  python3-dev
)

if [[ "${DLOP_SKIP_SYSTEM:-}" == 1 ]]; then
  exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup-system: no dpkg-query, so not Debian: make sure the equivalents of these are installed:" >&2
  echo "  ${PACKAGES[*]}" >&2
  exit 0
fi

# One line "name status" per package known to dpkg; unknown ones print nothing
# (and make dpkg-query exit 1, which is expected here).
status=$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${PACKAGES[@]}" 2>/dev/null || true)
missing=()
for p in "${PACKAGES[@]}"; do
  grep -qxF "$p installed" <<<"$status" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "setup-system: missing packages and not root, no sudo: as root run" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  sudo=(sudo)
fi
apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300)

echo "setup-system: installing ${missing[*]}"
"${apt[@]}" update -qq
"${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}"
