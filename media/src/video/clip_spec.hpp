// The "video" transform spec (its fields are documented with
// make_clip_pipeline in media/video.hpp), parsed strictly: unknown keys and
// bad values are kInvalidArgument errors naming the field.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "media/image_spec.hpp"

namespace dlop::media::detail {

// Where each view's clip starts in the sample's span: uniformly at random,
// or evenly spaced from its first to its last possible start.
enum class ClipStart { kRandom, kUniform };
enum class CropPosition { kRandom, kCenter };
enum class ClipLayout { kCTHW, kTCHW };
// A span with fewer frames than a clip covers: the clip repeats the span's
// last frame, or the sample fails.
enum class ShortClip { kPad, kError };
enum class RgbConversion { kExact, kFast };

struct ClipSpec {
  int frames = 16;  // T
  int stride = 1;  // frames between a clip's frames
  int views = 1;   // clips per sample
  ClipStart start = ClipStart::kRandom;
  int jitter = 0;  // each frame moves by up to this many frames either way
  // The shorter side a frame is resized to, drawn per view from [min, max];
  // none: frames keep their size and the crop is taken as it is.
  std::optional<std::array<int, 2>> short_side;
  std::array<int, 2> crop{0, 0};  // {height, width} of the output
  CropPosition crop_position = CropPosition::kRandom;
  double hflip = 0.0;  // probability, per view
  bool antialias = true;
  std::optional<std::array<std::array<float, 3>, 2>> normalize;  // {mean, std}
  ClipLayout layout = ClipLayout::kCTHW;
  OutputType output = OutputType::kUint8;
  ErrorPolicy on_error = ErrorPolicy::kRaise;
  ShortClip short_clip = ShortClip::kPad;
  RgbConversion rgb = RgbConversion::kExact;

  // The frames one clip spans: (frames - 1) * stride + 1.
  int span() const { return (frames - 1) * stride + 1; }
  static ClipSpec from_json(std::string_view json);
  std::string to_json() const;  // "kind": "video" included
};

}  // namespace dlop::media::detail
