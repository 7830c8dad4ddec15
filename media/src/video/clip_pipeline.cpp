// The clip pipeline: which frames each view of a sample takes (temporal
// sampling within the sample's time span), one spatial draw per view applied
// to all its frames (crop box chosen in source pixels, so only the crop is
// resized), and the batch layout.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "clip_spec.hpp"
#include "core/random.hpp"
#include "media/ops.hpp"
#include "media/video.hpp"

namespace dlop::media {
namespace {

using detail::ClipLayout;
using detail::ClipSpec;
using detail::ClipStart;
using detail::CropPosition;
using detail::ShortClip;

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Each view's draws come from streams of their own, so adding a view or a
// draw to one purpose never changes another's.
enum Purpose : std::uint64_t { kStart, kJitter, kScale, kCropPlace, kFlip, kPurposes };
SampleRng rng_for(const SampleKey& key, int view, Purpose purpose) {
  return SampleRng(key, static_cast<std::uint64_t>(view) * kPurposes + purpose);
}

// A view's spatial draws, applied to every frame of its clip.
struct ViewDraw {
  int short_side = 0;  // 0: frames keep their size
  double top = 0.5;    // where the crop sits in [0, 1] of the free room
  double left = 0.5;
  bool flip = false;
};

// The sample's frames, [first, last] in the index, inside its time span
// (seconds from the first frame).
std::pair<std::size_t, std::size_t> span_frames(const FrameIndex& index, const TimeSpan& span) {
  const double t0 = index.seconds(0);
  std::size_t first = 0;
  while (first < index.frames() && index.seconds(first) - t0 < span.start) ++first;
  std::size_t end = first;
  while (end < index.frames() && (span.end < 0 || index.seconds(end) - t0 < span.end)) ++end;
  if (end == first) {
    throw SampleError("", fmt::format("no frames in its time span [{}, {}] s ({} frames, {:.3f} s)", span.start,
                                      span.end, index.frames(), index.seconds(index.frames() - 1) - t0));
  }
  return {first, end - 1};
}

class ClipPipeline final : public BatchMaker {
 public:
  explicit ClipPipeline(ClipSpec spec) : spec_(std::move(spec)) {}
  std::string_view kind() const override { return "video"; }
  ErrorPolicy on_error() const override { return spec_.on_error; }
  std::string to_json() const override { return spec_.to_json(); }

  SampleLayout layout(const Source& source) const override {
    const auto t = static_cast<std::uint32_t>(spec_.frames);
    const auto h = static_cast<std::uint32_t>(spec_.crop[0]);
    const auto w = static_cast<std::uint32_t>(spec_.crop[1]);
    const auto v = static_cast<std::uint32_t>(spec_.views);
    SampleLayout layout;
    layout.shape = spec_.layout == ClipLayout::kCTHW ? std::vector<std::uint32_t>{v, 3, t, h, w}
                                                     : std::vector<std::uint32_t>{v, t, 3, h, w};
    layout.dtype = spec_.output;
    layout.label_width = source.multi_label() ? static_cast<std::uint32_t>(source.classes().size()) : 1;
    return layout;
  }

  BatchResult run_batch(const Source& source, std::span<const std::uint64_t> indices, std::uint64_t seed,
                        std::uint64_t epoch, const BatchOut& out, WorkerPool* pool) const override {
    const SampleLayout shape = layout(source);
    std::vector<Scratch> scratch(pool != nullptr ? pool->threads() : 1);
    return run_samples(source, indices, shape, out, spec_.on_error, pool,
                       [&](const Source& from, std::size_t k, std::size_t worker, StageTimes& times) {
                         const std::uint64_t index = indices[k];
                         Scratch& s = scratch[worker];
                         s.times = {};
                         std::byte* sample = out.samples.data() + k * shape.sample_bytes();
                         make(from, index, SampleKey{seed, epoch, index}, sample, s);
                         write_labels(from, index, out.labels.subspan(k * shape.label_width, shape.label_width));
                         times += s.times;
                       });
  }

 private:
  struct Scratch {
    std::vector<std::uint8_t> bytes, sidecar;
    Image resized;
    std::vector<std::byte> planes;  // one frame's CHW, before CTHW spreads it
    StageTimes times;
  };
  // One wanted frame: its position in the index, and where it goes.
  struct Slot {
    std::size_t frame;
    int view;
    int t;
  };

  // Frame positions of view v's clip within the span's n frames.
  std::vector<std::size_t> clip_frames(std::size_t n, int view, const SampleKey& key) const {
    const auto length = static_cast<std::size_t>(spec_.span());
    if (n < length && spec_.short_clip == ShortClip::kError) {
      throw SampleError("", fmt::format("{} frames in its time span, a clip of {} frames at stride {} needs {}", n,
                                        spec_.frames, spec_.stride, length));
    }
    const std::size_t room = n >= length ? n - length : 0;  // the last possible start
    std::size_t start = 0;
    if (spec_.start == ClipStart::kRandom) {
      SampleRng rng = rng_for(key, view, kStart);
      start = static_cast<std::size_t>(rng.randint(0, static_cast<std::int64_t>(room) + 1));
    } else if (spec_.views == 1) {
      start = room / 2;
    } else {
      const auto gaps = static_cast<std::size_t>(spec_.views - 1);
      start = (2 * static_cast<std::size_t>(view) * room + gaps) / (2 * gaps);  // rounded
    }
    SampleRng jitter = rng_for(key, view, kJitter);
    std::vector<std::size_t> frames(static_cast<std::size_t>(spec_.frames));
    for (std::size_t t = 0; t < frames.size(); ++t) {
      // Past the span's end a short clip repeats its last frame.
      auto at = static_cast<std::int64_t>(std::min(start + t * static_cast<std::size_t>(spec_.stride), n - 1));
      if (spec_.jitter > 0) {
        at = std::clamp<std::int64_t>(at + jitter.randint(-spec_.jitter, spec_.jitter + 1), 0,
                                      static_cast<std::int64_t>(n) - 1);
      }
      frames[t] = std::max(static_cast<std::size_t>(at), t > 0 ? frames[t - 1] : 0);
    }
    return frames;
  }

  ViewDraw draw_view(int view, const SampleKey& key) const {
    ViewDraw d;
    if (spec_.short_side) {
      SampleRng rng = rng_for(key, view, kScale);
      d.short_side = static_cast<int>(rng.randint((*spec_.short_side)[0], (*spec_.short_side)[1] + 1));
    }
    if (spec_.crop_position == CropPosition::kRandom) {
      SampleRng rng = rng_for(key, view, kCropPlace);
      d.top = rng.uniform();
      d.left = rng.uniform();
    }
    if (spec_.hflip > 0) d.flip = rng_for(key, view, kFlip).uniform() < spec_.hflip;
    return d;
  }

  // The crop in a height x width frame: the output size scaled by the
  // frame's shorter side over the drawn one, placed as drawn.
  CropBox crop_box(const ViewDraw& d, int height, int width) const {
    const double scale = d.short_side > 0 ? static_cast<double>(std::min(height, width)) / d.short_side : 1.0;
    const int h = std::clamp(static_cast<int>(std::lround(spec_.crop[0] * scale)), 1, height);
    const int w = std::clamp(static_cast<int>(std::lround(spec_.crop[1] * scale)), 1, width);
    if (spec_.crop_position == CropPosition::kCenter) return center_crop_box(height, width, h, w);
    const int top = std::min(static_cast<int>(d.top * (height - h + 1)), height - h);
    const int left = std::min(static_cast<int>(d.left * (width - w + 1)), width - w);
    return CropBox{top, left, h, w};
  }

  // Writes one frame (crop-sized RGB) at time t of a view's block.
  void emit(const Image& frame, int t, std::byte* view_out, Scratch& s) const {
    const std::size_t plane = static_cast<std::size_t>(frame.height) * frame.width;
    const std::size_t es = spec_.output == OutputType::kUint8 ? 1 : 4;
    const bool chw_in_place = spec_.layout == ClipLayout::kTCHW;
    std::byte* dst = chw_in_place ? view_out + static_cast<std::size_t>(t) * 3 * plane * es : nullptr;
    if (!chw_in_place) {
      s.planes.resize(3 * plane * es);
      dst = s.planes.data();
    }
    if (spec_.output == OutputType::kUint8) {
      to_chw_uint8(frame, reinterpret_cast<std::uint8_t*>(dst));
    } else {
      const auto& norm = spec_.normalize;
      to_chw_float(frame, norm ? (*norm)[0] : std::array<float, 3>{0, 0, 0},
                   norm ? (*norm)[1] : std::array<float, 3>{1, 1, 1}, reinterpret_cast<float*>(dst));
    }
    if (chw_in_place) return;
    for (std::size_t c = 0; c < 3; ++c) {
      std::memcpy(view_out + (c * static_cast<std::size_t>(spec_.frames) + static_cast<std::size_t>(t)) * plane * es,
                  s.planes.data() + c * plane * es, plane * es);
    }
  }

  void make(const Source& source, std::uint64_t index, const SampleKey& key, std::byte* out, Scratch& s) const {
    auto start = Clock::now();
    const std::span<const std::uint8_t> bytes = source.read(index, s.bytes);
    const std::span<const std::uint8_t> side = source.sidecar(index, s.sidecar);
    s.times.read += since(start);
    s.times.read_bytes += bytes.size() + side.size();

    start = Clock::now();
    const FrameIndex frames = side.empty() ? scan_frame_index(bytes, "") : FrameIndex::parse(side, "");
    const auto [first, last] = span_frames(frames, source.time_span(index));
    std::vector<Slot> slots;
    std::vector<ViewDraw> draws;
    for (int v = 0; v < spec_.views; ++v) {
      const std::vector<std::size_t> clip = clip_frames(last - first + 1, v, key);
      for (int t = 0; t < spec_.frames; ++t) slots.push_back({first + clip[static_cast<std::size_t>(t)], v, t});
      draws.push_back(draw_view(v, key));
    }
    std::stable_sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) { return a.frame < b.frame; });
    std::vector<std::size_t> wanted(slots.size());
    std::transform(slots.begin(), slots.end(), wanted.begin(), [](const Slot& x) { return x.frame; });

    const std::size_t view_bytes = 3 * static_cast<std::size_t>(spec_.frames) *
                                   static_cast<std::size_t>(spec_.crop[0] * spec_.crop[1]) *
                                   (spec_.output == OutputType::kUint8 ? 1 : 4);
    double in_sink = 0;
    decode_frames(bytes, frames, wanted, "", [&](std::size_t k, const Image& rgb) {
      const auto begin = Clock::now();
      s.times.decoded_bytes += rgb.pixels.size();
      const Slot& slot = slots[k];
      const ViewDraw& d = draws[static_cast<std::size_t>(slot.view)];
      resize(rgb, crop_box(d, rgb.height, rgb.width), spec_.crop[0], spec_.crop[1], spec_.antialias, s.resized);
      if (d.flip) hflip(s.resized);
      const auto augmented = Clock::now();
      s.times.augment += std::chrono::duration<double>(augmented - begin).count();
      emit(s.resized, slot.t, out + static_cast<std::size_t>(slot.view) * view_bytes, s);
      const double collate = since(augmented);
      s.times.collate += collate;
      in_sink += std::chrono::duration<double>(Clock::now() - begin).count();
    }, spec_.rgb == detail::RgbConversion::kExact);
    s.times.decode += since(start) - in_sink;
  }

  ClipSpec spec_;
};

}  // namespace

std::unique_ptr<BatchMaker> make_clip_pipeline(std::string_view spec_json) {
  return std::make_unique<ClipPipeline>(ClipSpec::from_json(spec_json));
}

}  // namespace dlop::media
