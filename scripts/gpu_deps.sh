#!/usr/bin/env bash
# Fetches, on this (Debian) machine, the Debian packages that dlop builds
# against and a GPU machine without internet may lack: UCX, fmt, spdlog,
# CLI11, nlohmann-json, libjpeg-turbo, libpng, zlib and libcrypto headers,
# ninja. They go into .gpu_deps/ (ignored by git), which a device run
# carries; scripts/gpu_check.sh unpacks them into its own prefix there
# (never into /). About 15 MB.
#
# Usage: scripts/gpu_deps.sh           (once; again only to refresh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PACKAGES=(
  libucx0 libucx-dev ucx-utils librdmacm1 libibverbs1 libnuma1
  libfmt9 libfmt-dev libspdlog1.10 libspdlog-dev libcli11-dev nlohmann-json3-dev
  libjpeg62-turbo libjpeg62-turbo-dev libpng16-16 libpng-dev zlib1g-dev libssl-dev
  ninja-build
)
mkdir -p .gpu_deps
grep -qxF '/.gpu_deps/' .git/info/exclude 2>/dev/null || echo '/.gpu_deps/' >>.git/info/exclude
apt-get update -qq
(cd .gpu_deps && apt-get download "${PACKAGES[@]}")
du -sh .gpu_deps
