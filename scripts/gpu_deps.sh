#!/usr/bin/env bash
# Fetches, on this (Debian) machine, the Debian packages that dlop builds
# against and a GPU machine without internet may lack: UCX, fmt, spdlog,
# CLI11, nlohmann-json, libjpeg-turbo, libpng, zlib, libcrypto and libcurl
# (with the libraries libcurl loads), ninja. They go into .gpu_deps/ (ignored
# by git), which a device run carries; scripts/gpu_check.sh unpacks them into
# its own prefix there (never into /) and loads only the libraries the machine
# lacks. FFmpeg and the audio libraries are left out (their closure is over
# 100 MB): that build is made with DLOP_WITH_MEDIA=OFF. About 15 MB.
#
# Usage: scripts/gpu_deps.sh           (once; again only to refresh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PACKAGES=(
  libucx0 libucx-dev ucx-utils librdmacm1 libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 libnuma1
  libfmt9 libfmt-dev libspdlog1.10 libspdlog-dev libcli11-dev nlohmann-json3-dev
  libjpeg62-turbo libjpeg62-turbo-dev libpng16-16 libpng-dev zlib1g zlib1g-dev libssl3 libssl-dev
  # libcurl and what it loads (apt-cache depends --recurse, less what every system has)
  libcurl4 libcurl4-openssl-dev libnghttp2-14 librtmp1 libssh2-1 libpsl5 libldap-2.5-0 libbrotli1
  libsasl2-2 libsasl2-modules-db libdb5.3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0
  libkeyutils1 libcom-err2 libidn2-0 libunistring2 libgnutls30 libnettle8 libhogweed6 libgmp10
  libp11-kit0 libtasn1-6 libffi8 libzstd1
  ninja-build
)
mkdir -p .gpu_deps
grep -qxF '/.gpu_deps/' .git/info/exclude 2>/dev/null || echo '/.gpu_deps/' >>.git/info/exclude
apt-get update -qq
(cd .gpu_deps && apt-get download "${PACKAGES[@]}")
du -sh .gpu_deps
