#include "media/image_pipeline.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <exception>

#include "media/codec.hpp"
#include "media/ops.hpp"

namespace dlop::media {
namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

ImagePipeline::ImagePipeline(TransformSpec spec) : spec_(std::move(spec)) {
  spec_.validate();
  const auto& ops = spec_.ops;
  pixel_ops_ = ops.size();
  if (pixel_ops_ > 0 && std::holds_alternative<NormalizeOp>(ops[pixel_ops_ - 1])) --pixel_ops_;
  if (pixel_ops_ > 0 && std::holds_alternative<HFlipOp>(ops[pixel_ops_ - 1])) --pixel_ops_;
}

std::optional<Shape> ImagePipeline::fixed_shape() const {
  std::optional<Size2> size;
  for (const OpSpec& op : spec_.ops) {
    std::visit(
        [&](const auto& o) {
          if constexpr (requires { o.output_size(size); }) size = o.output_size(size);
        },
        op);
  }
  if (!size) return std::nullopt;
  return Shape{3, (*size)[0], (*size)[1]};
}

const Image& ImagePipeline::transform(std::span<const std::uint8_t> encoded, const SampleKey& key,
                                 std::string_view name, Scratch& scratch) const {
  Image* cur = &scratch.a;
  Image* other = &scratch.b;
  const auto start = Clock::now();
  std::size_t first = 0;
  const auto* crop_first = spec_.ops.empty() ? nullptr : std::get_if<RandomResizedCropOp>(&spec_.ops.front());
  CropBox region;
  if (crop_first != nullptr) {
    // The crop is drawn from the header's size, so only its region is decoded.
    SampleRng rng(key, 0);
    region = decode_image_region(
        encoded, name,
        [&](int h, int w) { return random_resized_crop_box(h, w, crop_first->scale, crop_first->ratio, rng); },
        *cur, DecodeOptions{spec_.load_truncated_images});
  } else {
    decode_image(encoded, name, *cur, DecodeOptions{spec_.load_truncated_images});
  }
  const auto decoded = Clock::now();
  scratch.times.decode += seconds(decoded - start);
  scratch.times.decoded_bytes += cur->pixels.size();
  if (crop_first != nullptr) {
    resize(*cur, region, crop_first->size[0], crop_first->size[1], crop_first->antialias, *other);
    std::swap(cur, other);
    first = 1;
  }
  OpSample sample(*cur, *other, key);
  for (std::size_t i = first; i < pixel_ops_; ++i) {
    sample.at(i);
    std::visit([&](const auto& op) { op.apply(sample); }, spec_.ops[i]);
  }
  scratch.mirror = Mirror::kNo;
  if (pixel_ops_ < spec_.ops.size()) {
    if (const auto* flip = std::get_if<HFlipOp>(&spec_.ops[pixel_ops_])) {
      if (flip->flips(SampleRng(key, pixel_ops_))) scratch.mirror = Mirror::kYes;
    }
  }
  scratch.times.augment += seconds(Clock::now() - decoded);
  return sample.image();
}

void ImagePipeline::emit(const Image& image, Mirror mirror, std::byte* out) const {
  if (spec_.output == OutputType::kUint8) return to_chw_uint8(image, reinterpret_cast<std::uint8_t*>(out), mirror);
  NormalizeOp norm;
  if (!spec_.ops.empty()) {
    if (const auto* n = std::get_if<NormalizeOp>(&spec_.ops.back())) norm = *n;
  }
  to_chw_float(image, norm.mean, norm.std, reinterpret_cast<float*>(out), mirror);
}

Tensor ImagePipeline::run(std::span<const std::uint8_t> encoded, const SampleKey& key, std::string_view name) const {
  Scratch scratch;
  const Image& image = transform(encoded, key, name, scratch);
  Tensor t;
  t.dtype = spec_.output;
  t.shape = Shape{3, image.height, image.width};
  t.data.resize(t.shape.elements() * element_size());
  emit(image, scratch.mirror, t.data.data());
  return t;
}

SampleLayout ImagePipeline::layout(const Source& /*source*/) const {
  const std::optional<Shape> shape = fixed_shape();
  if (!shape) {
    throw_error(Errc::kInvalidArgument,
                "run_batch: samples of a batch need one size: end the ops with random_resized_crop, center_crop "
                "or resize to [height, width]");
  }
  return SampleLayout{{3, static_cast<std::uint32_t>(shape->height), static_cast<std::uint32_t>(shape->width)},
                      spec_.output};
}

BatchResult ImagePipeline::run_batch(const Source& source, std::span<const std::uint64_t> indices, std::uint64_t seed,
                                std::uint64_t epoch, const BatchOut& out, WorkerPool* pool) const {
  const SampleLayout shape = layout(source);
  const std::size_t sample_bytes = shape.sample_bytes();
  std::vector<Scratch> scratch(pool != nullptr ? pool->threads() : 1);
  return run_samples(source, indices, shape, out, spec_.on_error, pool,
                     [&](const Source& from, std::size_t k, std::size_t worker, StageTimes& times) {
                       Scratch& s = scratch[worker];
                       const std::uint64_t index = indices[k];
                       const auto start = Clock::now();
                       const auto bytes = from.read(index, s.bytes);
                       s.times = {};
                       s.times.read = seconds(Clock::now() - start);
                       s.times.read_bytes = bytes.size();
                       const Image& image = transform(bytes, SampleKey{seed, epoch, index}, {}, s);
                       const auto transformed = Clock::now();
                       emit(image, s.mirror, out.samples.data() + k * sample_bytes);
                       out.labels[k] = from.label(index);
                       s.times.collate += seconds(Clock::now() - transformed);
                       times += s.times;
                     });
}

BatchResult ImagePipeline::run_batch(const Source& source, std::span<const std::uint64_t> indices, std::uint64_t seed,
                                std::uint64_t epoch, std::span<std::byte> images, std::span<std::int64_t> labels,
                                WorkerPool* pool) const {
  return run_batch(source, indices, seed, epoch, BatchOut{images, labels, {}}, pool);
}

}  // namespace dlop::media
