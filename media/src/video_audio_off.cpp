// A build without video and audio (DLOP_WITH_MEDIA=OFF): the specs and the
// frame index that need FFmpeg or the audio libraries are refused by name, so a
// trainer built this way can still take video and audio batches from daemons
// built with them.
#include <fmt/format.h>

#include "core/error.hpp"
#include "media/audio.hpp"
#include "media/video.hpp"

namespace dlop::media {
namespace {

[[noreturn]] void refuse(std::string_view what) {
  throw_error(Errc::kInvalidArgument,
              fmt::format("{}: this dlop was built without video and audio (DLOP_WITH_MEDIA=OFF); "
                          "rebuild with FFmpeg, libsndfile, soxr and kissfft, or let dlop-offloader daemons decode",
                          what));
}

}  // namespace

std::unique_ptr<BatchMaker> make_clip_pipeline(std::string_view) { refuse("transform spec kind \"video\""); }
std::unique_ptr<BatchMaker> make_audio_pipeline(std::string_view) { refuse("transform spec kind \"audio\""); }
FrameIndex scan_frame_index(std::span<const std::uint8_t>, std::string_view name) {
  refuse(fmt::format("frame index of {}", name));
}
// Never reached (no FrameIndex is made without FFmpeg), but pack.cpp names it.
std::vector<std::uint8_t> FrameIndex::serialize() const { refuse("frame index"); }

}  // namespace dlop::media
