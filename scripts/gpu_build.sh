#!/usr/bin/env bash
# Sourced by scripts/gpu_check.sh, or on its own on a GPU machine before any
# command of your own there:
#
#   source scripts/gpu_build.sh [LOGS]     (LOGS: where configure.log and build.log go, default build-gpu)
#
# Builds dlop in build-gpu against the torch found there, with the Debian
# packages and the minimal FFmpeg build of .gpu_deps/ (made here by
# scripts/gpu_deps.sh: 21.4 MB, of which FFmpeg 1.9 MB and audio 1.9 MB) where
# the machine lacks them, and exports what running it needs (PYTHONPATH,
# LD_LIBRARY_PATH, UCX_MODULE_DIR). With FFmpeg, libsndfile, soxr and kissfft
# found (the machine's or the carried ones) the build has video and audio
# (DLOP_WITH_MEDIA=ON: dlop-offloader decodes clips natively); without them,
# DLOP_WITH_MEDIA=OFF. Returns non-zero if the build or the import fails.
# Rehearsed on a 2-core Debian 12 machine with its own FFmpeg, audio libraries,
# headers and pkg-config files hidden (a mount namespace): media ON, the
# build 643 s, dlop-offloader loading the carried libraries, and
# tests/python/test_offload_media.py passing against it.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || return 1
ROOT=$PWD
PY=${PY:-${PYTHON:-python3}}
LOGS=${1:-build-gpu}
mkdir -p "$LOGS"

# --- dependencies: the machine's own, else the carried .debs in a private prefix
DEPS=/opt/dlop-deps
if [[ -d .gpu_deps ]] && ! pkg-config --exists ucx 2>/dev/null; then
  # Unpacked once per machine: a second source (a script's next command on a warm machine) only exports.
  stamp=$(cd .gpu_deps && ls -l --time-style=+%s | md5sum | cut -c1-32)
  if [[ $(cat "$DEPS/.unpacked" 2>/dev/null) != "$stamp" ]]; then
    rm -rf "$DEPS/missing"; mkdir -p "$DEPS/missing"
    for deb in .gpu_deps/*.deb; do dpkg -x "$deb" "$DEPS"; done
    # FFmpeg: libraries, headers and pkg-config files laid out as Debian's packages have them.
    for archive in .gpu_deps/ffmpeg-*.tar.xz; do [[ -e $archive ]] && tar -xJf "$archive" -C "$DEPS"; done
    # The build links libsndfile dynamically: the -dev packages of the codecs it
    # loads (sndfile.pc's Requires.private) are not carried.
    pc=$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig/sndfile.pc
    [[ -e $pc ]] && sed -i '/^Requires.private:/d' "$pc"
    # Absolute links (zlib1g-dev's libz.so -> /lib/...) must point into the prefix.
    find "$DEPS" -type l -lname '/*' | while read -r link; do ln -sfn "$DEPS$(readlink "$link")" "$link"; done
    # Only the libraries this machine lacks are loaded from the prefix: its own
    # libssl or libz stay in use by everything else in the process (Python's too).
    known=$(ldconfig -p | awk '{print $1}')
    for lib in "$DEPS"/usr/lib/x86_64-linux-gnu/lib*.so.* "$DEPS"/lib/x86_64-linux-gnu/lib*.so.*; do
      # UCX's libraries go together with its modules (the machine's own may be another version).
      [[ -e $lib ]] && { [[ $(basename "$lib") == libuc[pstm].so* ]] || ! grep -qxF "$(basename "$lib")" <<<"$known"; } &&
        ln -sf "$lib" "$DEPS/missing/"
    done
    echo "$stamp" >"$DEPS/.unpacked"
  fi
  export PKG_CONFIG_PATH="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}"
  export CMAKE_PREFIX_PATH="$DEPS/usr:${CMAKE_PREFIX_PATH:-}"
  export LD_LIBRARY_PATH="$DEPS/missing:${LD_LIBRARY_PATH:-}"
  export PATH="$DEPS/usr/bin:$PATH"
  # UCX finds its transport modules next to itself, under the prefix.
  export UCX_MODULE_DIR="$DEPS/usr/lib/x86_64-linux-gnu/ucx"
  # pkg-config files name /usr: point them at the prefix.
  export PKG_CONFIG_SYSROOT_DIR=$DEPS
  # Their headers are third-party: a newer GCC's warnings in them must not
  # fail the build. GCC 13 reports false array-bounds and stringop-overflow
  # warnings in fmt 9's inlined code at our call sites, which -isystem cannot
  # silence: warnings stay warnings there (CI keeps -Werror).
  export CXXFLAGS="-isystem $DEPS/usr/include ${CXXFLAGS:-}"
  WERROR=OFF
fi
# Video and audio (dlop-offloader's native FFmpeg pipeline) when their
# libraries are there, the machine's or .gpu_deps'; else a build without them.
MEDIA=ON
pkg-config --exists libavformat libavcodec libavutil libswscale sndfile soxr kissfft-float 2>/dev/null || MEDIA=OFF
echo "media: $MEDIA (FFmpeg $(pkg-config --modversion libavcodec 2>/dev/null || echo none))" | tee -a "$LOGS/machine.txt"

# --- build (no C++ tests or benchmarks: the Python side is what runs here)
G=Ninja; command -v ninja >/dev/null || G="Unix Makefiles"
# Configured once for the same arguments: a second source finds build-gpu configured and up to date.
args=(-G "$G" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOP_BUILD_TESTS=OFF -DDLOP_BUILD_BENCH=OFF -DDLOP_WITH_MEDIA=$MEDIA
  -DCMAKE_CXX_FLAGS="${CXXFLAGS:-}" -DDLOP_WARNINGS_AS_ERRORS=${WERROR:-ON} -DPython_EXECUTABLE="$(command -v "$PY")")
if [[ ! -f build-gpu/CMakeCache.txt || $(cat build-gpu/.dlop-configure-args 2>/dev/null) != "${args[*]}" ]]; then
  rm -f build-gpu/.dlop-configure-args
  cmake -S . -B build-gpu "${args[@]}" >"$LOGS/configure.log" 2>&1 || { tail -30 "$LOGS/configure.log"; return 1; }
  echo "${args[*]}" >build-gpu/.dlop-configure-args
fi
cmake --build build-gpu -j"$(nproc)" >"$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; return 1; }
export PYTHONPATH="$ROOT/python:$ROOT/tests/python:${PYTHONPATH:-}"
"$PY" -c 'import dlop, dlop._C; print("dlop", dlop.__version__, "loads")' || return 1
{
  echo "compiler: $(grep -m1 CMAKE_CXX_COMPILER: build-gpu/CMakeCache.txt | cut -d= -f2) ($(readlink -f "$(grep -m1 CMAKE_CXX_COMPILER: build-gpu/CMakeCache.txt | cut -d= -f2)"))"
  readelf -d python/dlop/_C*.so | grep NEEDED | tr -s ' ' | cut -d' ' -f5- | tr '\n' ' '; echo
  echo "libstdc++ symbols exported by dlop._C: $(nm -D --defined-only python/dlop/_C*.so | grep -c ' _ZNS[aio]')"
} | tee -a "$LOGS/machine.txt"
# Unmodified scripts find the backend through the package's entry point, as
# pip would install it: give this source tree the same metadata.
SITE=$ROOT/build-gpu/site; mkdir -p "$SITE/dlop-0.0.dist-info"
printf 'Metadata-Version: 2.1\nName: dlop\nVersion: 0.0\n' >"$SITE/dlop-0.0.dist-info/METADATA"
sed -n '/^\[project.entry-points/,/^$/p' pyproject.toml | sed -e 's/^\[project.entry-points."\(.*\)"\]/[\1]/' -e 's/"//g' \
  >"$SITE/dlop-0.0.dist-info/entry_points.txt"
export PYTHONPATH="$SITE:$PYTHONPATH"
