// The transform ops, as one table: a struct per op, and OpSpec, the variant
// that lists them. Everything about an op is in its struct:
//   kName            its "op" in the spec JSON
//   params(op, v)    its parameters in order, each once: v.KIND("json key",
//                    field, ...). The field's initial value is the default, a
//                    kRequired one has none. The JSON parser, validate(),
//                    to_json() and describe_ops() (the list Python reads) all
//                    walk this, so they cannot disagree.
//   check()          optional: rules across its parameters; returns what is
//                    wrong, or an empty string
//   output_size(in)  optional: the sample's {height, width} after it when
//                    fixed (nullopt: depends on the input); absent: unchanged
//   apply(sample)    what it does to one sample
// Adding an op is a struct here and its name in OpSpec (plus, when it mirrors
// a torchvision transform, a line in python/dlop/data/wrap.py's table).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "core/random.hpp"
#include "media/image.hpp"
#include "media/ops.hpp"

namespace dlop::media {

// A size: {height, width}; JSON "size": 224 means {224, 224} except in
// resize, where one number is the shorter side (see ResizeOp).
using Size2 = std::array<int, 2>;
inline constexpr int kMaxSide = 1 << 15;

enum class Need { kOptional, kRequired };
// The lower bound of a [low, high] range parameter.
enum class Low { kZeroOrMore, kPositive };
// Whether a per-channel parameter may hold 0 (a divisor may not).
enum class Zero { kAllowed, kRefused };

// One sample on its way through the ops: its current image, a spare one to
// write into, and its randomness.
class OpSample {
 public:
  OpSample(Image& image, Image& spare, const SampleKey& key) : cur_(&image), other_(&spare), key_(key) {}
  Image& image() { return *cur_; }
  // An image an op may write its result into; commit() makes it the current one.
  Image& spare() { return *other_; }
  void commit() { std::swap(cur_, other_); }
  // The op at position `op` of the spec is running.
  void at(std::size_t op) { op_ = op; }
  // This op's own random stream (its position), so the draws of one op never
  // depend on how many another made.
  SampleRng rng() const { return SampleRng(key_, op_); }

 private:
  Image* cur_;
  Image* other_;
  SampleKey key_;
  std::size_t op_ = 0;
};

// torchvision's RandomResizedCrop.
struct RandomResizedCropOp {
  static constexpr std::string_view kName = "random_resized_crop";
  Size2 size{224, 224};
  std::array<double, 2> scale{0.08, 1.0};
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};
  bool antialias = true;

  static void params(auto& op, auto& v) {
    v.size("size", op.size, Need::kRequired);
    v.range("scale", op.scale, Low::kPositive);
    v.range("ratio", op.ratio, Low::kPositive);
    v.flag("antialias", op.antialias);
  }
  std::optional<Size2> output_size(std::optional<Size2>) const { return size; }
  void apply(OpSample& s) const {
    SampleRng rng = s.rng();
    const Image& in = s.image();
    resize(in, random_resized_crop_box(in.height, in.width, scale, ratio, rng), size[0], size[1], antialias,
           s.spare());
    s.commit();
  }
};

// torchvision's Resize.
struct ResizeOp {
  static constexpr std::string_view kName = "resize";
  // Exactly {height, width}; or, when `shorter` is set, the shorter side,
  // the other following the aspect ratio (torchvision's Resize(int)).
  std::optional<Size2> size;
  std::optional<int> shorter;
  int max_size = 0;  // 0: none; only with `shorter`
  bool antialias = true;

  static void params(auto& op, auto& v) {
    v.size_or_side("size", op.size, op.shorter);
    v.integer("max_size", op.max_size, 0, kMaxSide);
    v.flag("antialias", op.antialias);
  }
  std::string check() const {
    if (max_size != 0 && (!shorter || max_size <= *shorter)) {
      return "\"max_size\" needs \"size\" as one integer smaller than it";
    }
    return {};
  }
  std::optional<Size2> output_size(std::optional<Size2>) const { return size; }
  void apply(OpSample& s) const {
    const Image& in = s.image();
    const auto [h, w] = size ? std::pair{(*size)[0], (*size)[1]} : resize_shorter_side(in.height, in.width, *shorter, max_size);
    if (h == in.height && w == in.width) return;
    resize(in, CropBox{0, 0, in.height, in.width}, h, w, antialias, s.spare());
    s.commit();
  }
};

// torchvision's CenterCrop (zero-padding where the image is smaller).
struct CenterCropOp {
  static constexpr std::string_view kName = "center_crop";
  Size2 size{224, 224};

  static void params(auto& op, auto& v) { v.size("size", op.size, Need::kRequired); }
  std::optional<Size2> output_size(std::optional<Size2>) const { return size; }
  void apply(OpSample& s) const {
    const Image& in = s.image();
    const CropBox box = center_crop_box(in.height, in.width, size[0], size[1]);
    if (box == CropBox{0, 0, in.height, in.width}) return;
    crop(in, box, s.spare());
    s.commit();
  }
};

// torchvision's RandomHorizontalFlip.
struct HFlipOp {
  static constexpr std::string_view kName = "hflip";
  double p = 0.5;

  static void params(auto& op, auto& v) { v.number("p", op.p, 0.0, 1.0); }
  // The draw, in one place for apply() and for the pipeline's layout step,
  // which mirrors as it writes when a flip is the last pixel op.
  bool flips(SampleRng rng) const { return rng.uniform() < p; }
  void apply(OpSample& s) const {
    if (flips(s.rng())) hflip(s.image());
  }
};

// torchvision's ToTensor then Normalize. Must be the last op and makes the
// output float32: it runs in the pipeline's layout step (to_chw_float).
struct NormalizeOp {
  static constexpr std::string_view kName = "normalize";
  static constexpr bool kLastAndFloat = true;
  std::array<float, 3> mean{0.0f, 0.0f, 0.0f};
  std::array<float, 3> std{1.0f, 1.0f, 1.0f};

  static void params(auto& op, auto& v) {
    v.channels("mean", op.mean, Zero::kAllowed);
    v.channels("std", op.std, Zero::kRefused);
  }
  void apply(OpSample&) const {}
};

// The table: every op a spec may name.
using OpSpec = std::variant<RandomResizedCropOp, ResizeOp, CenterCropOp, HFlipOp, NormalizeOp>;

std::string_view op_name(const OpSpec& op);

}  // namespace dlop::media
