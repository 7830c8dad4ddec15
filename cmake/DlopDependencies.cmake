# Required and optional dependencies. A missing optional one turns its part off
# with one message; the result lands in the generated core/config_features.hpp.
find_package(PkgConfig REQUIRED)
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()
find_package(nlohmann_json REQUIRED)
find_package(Threads REQUIRED)
# Image decoding for media/ (libjpeg-turbo's libjpeg API, libpng; zlib for
# the record files' checksums).
find_package(JPEG REQUIRED)
find_package(PNG REQUIRED)
find_package(ZLIB REQUIRED)
# Video clips (FFmpeg) and audio (libsndfile, soxr, kissfft) for media/.
# A trainer whose batches all come from daemons decodes nothing itself: it can
# be built without them (DLOP_WITH_MEDIA=OFF), e.g. on a GPU host that lacks
# FFmpeg's many libraries. Video and audio specs are then refused by name.
option(DLOP_WITH_MEDIA "Video and audio decoding in media/ (FFmpeg, libsndfile, soxr, kissfft)" ON)
set(DLOP_HAVE_MEDIA ${DLOP_WITH_MEDIA})
if(DLOP_WITH_MEDIA)
  pkg_check_modules(FFMPEG IMPORTED_TARGET libavformat libavcodec libavutil libswscale)
  pkg_check_modules(AUDIO IMPORTED_TARGET sndfile soxr kissfft-float)
  if(NOT FFMPEG_FOUND OR NOT AUDIO_FOUND)
    message(FATAL_ERROR "dlop: FFmpeg, libsndfile, soxr or kissfft not found: install them "
                        "(scripts/setup-system.sh), or configure with -DDLOP_WITH_MEDIA=OFF to build without video and audio")
  endif()
endif()
# dlop-offloader's control connection: HMAC-SHA256 and nonces (libcrypto).
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
# Sources in object stores and on HTTP(S) servers (media/src/store: SigV4 signing).
find_package(CURL REQUIRED)

find_package(MPI COMPONENTS C QUIET)
set(DLOP_HAVE_MPI ${MPI_C_FOUND})
if(NOT DLOP_HAVE_MPI)
  message(STATUS "dlop: MPI not found: the MPI bootstrap and MPI columns of dlop-bench are off")
endif()

if(DLOP_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(DLOP_BUILD_BENCH)
  find_package(benchmark QUIET)
  if(NOT benchmark_FOUND)
    message(STATUS "dlop: Google Benchmark not found: micro-benchmarks are off")
  endif()
endif()
