#!/usr/bin/env bash
# Fetches, on this (Debian) machine, what dlop builds against and a GPU
# machine without internet may lack, into .gpu_deps/ (ignored by git), which a
# device run carries; scripts/gpu_build.sh unpacks it into its own prefix there
# (never into /) and loads only the libraries the machine lacks:
#
# - Debian packages: UCX, fmt, spdlog, CLI11, nlohmann-json, libjpeg-turbo,
#   libpng, zlib, libcrypto and libcurl (with the libraries libcurl loads),
#   ninja; and for audio libsndfile (with the codec libraries it loads), soxr
#   and kissfft.
# - FFmpeg for the native video pipeline, as ffmpeg-<version>-min.tar.xz: the
#   libraries and headers of a minimal build of Debian's own FFmpeg source (the
#   version this machine's packages have), made here once (about 3 minutes on
#   2 cores; needs a C compiler and nasm, installed when missing): libavcodec,
#   libavformat, libavutil and libswscale; decoders H.264, HEVC, VP8, VP9,
#   MPEG-4 part 2, MPEG-1/2 and MJPEG; demuxers mov/mp4, Matroska/WebM, AVI,
#   MPEG-TS and raw streams; no network, no external libraries but zlib.
#
# Why not Debian's FFmpeg packages: measured 2026-11-28, their runtime
# closure (libavcodec59 and the rest, with libsndfile, soxr and kissfft) is 140
# packages, 70.9 MB, and 58.2 MB beyond what .gpu_deps already holds and every
# Debian system has (x264, x265, aom, codec2, svt-av1, rav1e, libva, X11, ICU,
# librsvg, fonts...), with 8 MB more of -dev packages: it cannot travel.
# The opencv-python-headless wheel's bundled FFmpeg cannot be linked instead:
# its 4.13 and later wheels bundle FFmpeg 8.0 (libavcodec 62), whose headers
# no Debian suite has (bookworm has 5.1, trixie 7.1, forky and sid 9.0), and
# the FFmpeg 5.1 libraries of the 4.12 wheel (whose headers bookworm has) need
# its libvpx, libssl and libcrypto: 25.4 MB, 8.5 MB as xz.
#
# Sizes (2026-11-28, bytes): the Debian .debs 19,400,504 (the audio ones
# 1,884,328 of it), the FFmpeg archive 1,949,976 (7.7 MB unpacked): .gpu_deps
# 21,350,480 (ignored by git, like .gpu_data). A device run carries at most
# 64 MiB: make gpu-carry (scripts/gpu_carry.sh) sums the tree as it would
# travel and the carried folders, and prints the carry list (2026-12-02: tree
# 7.5 MiB + .gpu_deps and .gpu_data 37.6 MiB = 45.0 MiB).
#
# Usage: scripts/gpu_deps.sh           (make gpu-carry runs it once; again only to refresh; FFMPEG=0
#                                       skips FFmpeg, JOBS sets its build's jobs)
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
  # audio: libsndfile and the libraries it loads, soxr (with libgomp), kissfft. sndfile.pc's
  # Requires.private (flac, ogg, vorbis, opus, mpg123 -dev) stay here: gpu_build.sh drops that line.
  libsndfile1 libsndfile1-dev libflac12 libogg0 libvorbis0a libvorbisenc2 libopus0 libmpg123-0 libmp3lame0
  libsoxr0 libsoxr-dev libgomp1 libkissfft-float131 libkissfft-dev
  ninja-build
)
mkdir -p .gpu_deps
sudo=(); ((EUID == 0)) || sudo=(sudo)
"${sudo[@]}" apt-get update -qq
(cd .gpu_deps && apt-get download "${PACKAGES[@]}")

# --- FFmpeg: a minimal build of Debian's source, the version of this machine's libavcodec
if [[ ${FFMPEG:-1} != 0 ]]; then
  version=$(apt-cache policy libavcodec-dev | awk '/Candidate:/ {print $2}')  # 7:5.1.9-0+deb12u1
  version=${version%+b[0-9]*}                                                 # a binNMU's source has no +bN
  upstream=${version#*:}; upstream=${upstream%%-*}                            # 5.1.9
  archive=.gpu_deps/ffmpeg-$upstream-min.tar.xz
  if [[ -e $archive ]]; then
    echo "$archive is there (remove it to rebuild)"
  else
    rm -f .gpu_deps/ffmpeg-*-min.tar.xz
    command -v nasm >/dev/null || "${sudo[@]}" apt-get install -y -qq --no-install-recommends nasm
    command -v dpkg-source >/dev/null || "${sudo[@]}" apt-get install -y -qq --no-install-recommends dpkg-dev
    work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
    # Source lines for the suites apt already uses (deb-src beside each deb), in private lists.
    mkdir -p "$work/parts" "$work/lists/partial"
    for f in /etc/apt/sources.list.d/*.sources; do
      [[ -e $f ]] && sed 's/^Types:.*/Types: deb-src/' "$f" >"$work/parts/$(basename "$f")"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [[ -e $f ]] && { grep -E '^deb ' "$f" | sed 's/^deb /deb-src /' || true; } >"$work/parts/$(basename "$f").list"
    done
    apt=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts" -o "Dir::State::Lists=$work/lists")
    apt-get "${apt[@]}" update -qq
    (cd "$work" && apt-get "${apt[@]}" source --download-only "ffmpeg=$version" && dpkg-source -x ffmpeg_*.dsc src >/dev/null)
    (
      cd "$work/src"
      ./configure --prefix=/usr --libdir=/usr/lib/x86_64-linux-gnu --shlibdir=/usr/lib/x86_64-linux-gnu \
        --incdir=/usr/include/x86_64-linux-gnu --enable-shared --disable-static --enable-pic --disable-debug \
        --disable-programs --disable-doc --disable-network --disable-autodetect --disable-everything \
        --disable-avdevice --disable-avfilter --disable-postproc --disable-swresample --enable-zlib \
        --enable-decoder=h264,hevc,vp8,vp9,mpeg4,mjpeg,mpeg1video,mpeg2video \
        --enable-demuxer=mov,matroska,avi,mpegts,h264,hevc,m4v,mpegvideo,ivf \
        --enable-parser=h264,hevc,vp8,vp9,mpeg4video,mpegvideo,mjpeg --enable-protocol=file >"$work/configure.log" ||
        { tail -20 "$work/configure.log"; exit 1; }
      make -j"${JOBS:-$(nproc)}" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
      make install DESTDIR="$work/stage" >>"$work/build.log" 2>&1
    )
    rm -rf "$work/stage/usr/share"
    strip --strip-unneeded "$work"/stage/usr/lib/x86_64-linux-gnu/lib*.so.*.*
    tar -C "$work/stage" -cf - usr | xz -9 -T0 >"$archive.tmp" && mv "$archive.tmp" "$archive"
  fi
fi
du -sh .gpu_deps
