// Video clips (libavformat, libavcodec, libswscale): a frame index per file,
// exact decoding of the frames a clip wants, and the clip pipeline, the batch
// maker of the "video" transform spec.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "offload/batch_maker.hpp"
#include "offload/image.hpp"

namespace dlop::offload {

// Every frame of a file's video stream, in presentation order. Made by
// demuxing alone (no decoding), once: by `dlop pack`, which stores it beside
// the file (Source::sidecar), or when an unpacked file is read.
struct FrameIndex {
  int stream = 0;  // the video stream's index in the container
  std::int32_t time_base_num = 1;
  std::int32_t time_base_den = 1;
  int width = 0;
  int height = 0;
  std::vector<std::int64_t> pts;       // ascending
  std::vector<std::uint8_t> keyframe;  // 1 where the frame is a keyframe

  std::size_t frames() const { return pts.size(); }
  double seconds(std::size_t frame) const;  // pts[frame] in seconds
  std::vector<std::uint8_t> serialize() const;
  // Throws SampleError naming `name` when the bytes are not a frame index.
  static FrameIndex parse(std::span<const std::uint8_t> bytes, std::string_view name);
};

// Demuxes `container` (any format FFmpeg reads, from memory). Throws
// SampleError naming `name` when it holds no video stream FFmpeg decodes.
FrameIndex scan_frame_index(std::span<const std::uint8_t> container, std::string_view name);

// Decodes frames `wanted` (positions in index.pts, ascending; repeats
// allowed) to RGB, calling sink(k, image) for wanted[k] in order: from the
// keyframe at or before each wanted frame, forward, matching frames by pts,
// and no further than the last wanted frame. One decoder thread.
void decode_frames(std::span<const std::uint8_t> container, const FrameIndex& index,
                   std::span<const std::size_t> wanted, std::string_view name,
                   const std::function<void(std::size_t k, const Image& rgb)>& sink);

// The "video" spec ("kind" removed): sampling, per-clip spatial ops, layout.
// Throws dlop::Error(kInvalidArgument) naming the bad field.
std::unique_ptr<BatchMaker> make_clip_pipeline(std::string_view spec_json);

}  // namespace dlop::offload
