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

#include "media/batch_maker.hpp"
#include "media/image.hpp"

namespace dlop::media {

// Every frame of a file's video stream, in presentation order. Made by
// demuxing alone (no decoding), once: by `dlop pack`, which stores it beside
// the file (Source::sidecar), or when an unpacked file is read.
struct FrameIndex {
  int stream = 0;  // the video stream's index in the container
  std::int32_t time_base_num = 1;
  std::int32_t time_base_den = 1;
  int width = 0;
  int height = 0;
  // Ascending and distinct (a timestamp shown twice keeps its first frame):
  // decoded frames are matched to positions by their timestamp.
  std::vector<std::int64_t> pts;
  // Some packets had no pts (AVI, raw streams): timestamps then come from
  // the dts, which do not follow display order with B-frames, so decoded
  // frames are matched by their count from the first frame instead (and
  // decoding always starts there).
  bool decode_order = false;
  std::vector<std::uint8_t> keyframe;  // 1 where the frame is a keyframe

  std::size_t frames() const { return pts.size(); }
  double seconds(std::size_t frame) const;  // pts[frame] in seconds
  // "DLFI", version 1, then little-endian: flags (uint32, bit 0:
  // decode_order), stream, time base, width, height (int32 each), the frame
  // count (uint64), every pts (int64), every keyframe flag (one byte).
  std::vector<std::uint8_t> serialize() const;
  // Throws SampleError naming `name` when the bytes are not a frame index:
  // wrong magic or version, a size other than the count implies, a time base
  // or size out of range, timestamps not ascending. Never reads past `bytes`.
  static FrameIndex parse(std::span<const std::uint8_t> bytes, std::string_view name);
};

// Demuxes `container` (any format FFmpeg reads, from memory): the best video
// stream's packets sorted by pts (without one, by dts: see decode_order; packets
// an edit list cuts are left out, as decoders drop their frames). Throws
// SampleError naming `name` when it is no container, holds no video stream,
// or none FFmpeg has a decoder for.
FrameIndex scan_frame_index(std::span<const std::uint8_t> container, std::string_view name);

// Decodes frames `wanted` (positions in index.pts, ascending; repeats
// allowed) to RGB, calling sink(k, image) for wanted[k] in order: from the
// keyframe at or before each wanted frame, forward, matching frames by pts,
// and no further than the last wanted frame. A wanted frame with a keyframe
// between it and the frames decoded so far is reached by a new seek. When the
// container's seek lands after a wanted frame, the rest is decoded in one pass
// from the start. Frames are converted to RGB24 as ffmpeg's scale filter does
// (the frame's own colour matrix and range): with -sws_flags
// bicubic+bitexact+accurate_rnd when `exact_rgb` (the same on every CPU), else
// with its default flags, the faster path that ffmpeg, torchcodec and PyAV
// take by default (SIMD code chosen by the CPU). One decoder thread. Throws SampleError naming `name` for
// anything wrong with the file (a wanted frame never decoded included), and
// dlop::Error(kInvalidArgument) when `wanted` does not ascend or is past the
// index's end.
void decode_frames(std::span<const std::uint8_t> container, const FrameIndex& index,
                   std::span<const std::size_t> wanted, std::string_view name,
                   const std::function<void(std::size_t k, const Image& rgb)>& sink, bool exact_rgb = true);

// The "video" spec ("kind" may be left in; it must then be "video"):
//   frames        T, frames per clip (16; 1 .. 4096)
//   stride        positions between a clip's frames (1; 1 .. 1024)
//   views         clips per sample (1; 1 .. 64)
//   start         "random" (each view's first frame uniform over the possible
//                 starts) or "uniform" (views evenly spaced from the first to
//                 the last possible start; one view: the middle) ("random")
//   jitter        each frame moved by a uniform integer in [-jitter, jitter],
//                 kept in the span and non-decreasing (0)
//   short_side    N or [min, max]: the shorter side frames are resized to,
//                 drawn per view; absent or null: the crop is taken in the
//                 frame's own pixels (absent)
//   crop          N or [height, width], the output size (required; at most
//                 short_side's min)
//   crop_position "random" or "center" ("random"); the box is placed in the
//                 source frame, the output size times source short side over
//                 short_side, so only it is resized
//   hflip         probability of mirroring a view (0)
//   antialias     the resize's filter widens when shrinking (true)
//   normalize     {"mean": [3], "std": [3]}: (x / 255 - mean) / std; needs
//                 float32 output (absent)
//   layout        "CTHW" (sample {views, 3, T, H, W}) or "TCHW"
//                 ({views, T, 3, H, W}) ("CTHW")
//   output        "uint8" or "float32" (x / 255 without normalize) ("uint8")
//   on_error      "raise" or "skip" ("raise")
//   short_clip    a span with fewer than (frames - 1) * stride + 1 frames:
//                 "pad" (positions past its end repeat its last frame) or
//                 "error" (a SampleError) ("pad")
//   rgb           "exact" (the same pixels on every CPU) or "fast" (swscale's
//                 default path, as ffmpeg, torchcodec and PyAV convert) ("exact")
// The span is the sample's Source::time_span in seconds from its first
// frame. Each view draws its start, jitter, short side, crop place and flip
// from streams of its own keyed by {seed, epoch, index}; spatial draws apply
// to every frame of the view. The frame index is the source's sidecar when
// it has one. Throws dlop::Error(kInvalidArgument) naming the bad field.
std::unique_ptr<BatchMaker> make_clip_pipeline(std::string_view spec_json);

}  // namespace dlop::media
