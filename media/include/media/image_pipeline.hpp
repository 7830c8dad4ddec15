// The image batch maker: runs a TransformSpec on one sample's encoded bytes
// (a CHW tensor), or on a batch of a Source's samples (N x C x H x W).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/random.hpp"
#include "media/batch_maker.hpp"
#include "media/image.hpp"
#include "media/ops.hpp"
#include "media/source.hpp"
#include "media/image_spec.hpp"

namespace dlop::media {

// A sample's output shape, CHW (C is always 3).
struct Shape {
  int channels = 3;
  int height = 0;
  int width = 0;
  std::size_t elements() const { return static_cast<std::size_t>(channels) * height * width; }
  bool operator==(const Shape&) const = default;
};

struct Tensor {
  OutputType dtype = OutputType::kFloat32;
  Shape shape;
  std::vector<std::byte> data;  // shape.elements() values of dtype
};

class ImagePipeline final : public BatchMaker {
 public:
  explicit ImagePipeline(TransformSpec spec);  // validates
  static ImagePipeline from_json(std::string_view json) { return ImagePipeline(TransformSpec::from_json(json)); }

  const TransformSpec& spec() const { return spec_; }
  std::string_view kind() const override { return "image"; }
  ErrorPolicy on_error() const override { return spec_.on_error; }
  std::string to_json() const override { return spec_.to_json(); }
  // {3, H, W} of fixed_shape(); throws when the ops do not end in a fixed size.
  SampleLayout layout(const Source& source) const override;
  BatchResult run_batch(const Source& source, std::span<const std::uint64_t> indices, std::uint64_t seed,
                        std::uint64_t epoch, const BatchOut& out, WorkerPool* pool) const override;
  std::size_t element_size() const { return spec_.output == OutputType::kUint8 ? 1 : 4; }
  // The output shape when it does not depend on the input (the last sizing op
  // is a random_resized_crop, a center_crop or a resize to {h, w}).
  std::optional<Shape> fixed_shape() const;

  // One sample. Randomness is drawn from `key` only. Throws SampleError when
  // the bytes cannot be decoded, whatever the policy (the policy is applied
  // by run_batch). `name` is for messages.
  Tensor run(std::span<const std::uint8_t> encoded, const SampleKey& key, std::string_view name = "") const;

  // Samples `indices` of `source` into `images` (N x C x H x W of the output
  // type, N = indices.size(), needs fixed_shape()) and `labels` (N). With the
  // skip policy, unreadable samples are left out and the others moved up, in
  // order; with raise, the first failure (in index order) is thrown. Each
  // sample's key is {seed, epoch, its index}; `pool` may be null (this thread).
  BatchResult run_batch(const Source& source, std::span<const std::uint64_t> indices, std::uint64_t seed,
                        std::uint64_t epoch, std::span<std::byte> images, std::span<std::int64_t> labels,
                        WorkerPool* pool = nullptr) const;

 private:
  struct Scratch {
    Image a, b;
    std::vector<std::uint8_t> bytes;
    StageTimes times;
    Mirror mirror = Mirror::kNo;  // what the flip left to the layout step drew
  };
  // Decodes and runs the geometric ops; the result is in scratch.a or .b.
  const Image& transform(std::span<const std::uint8_t> encoded, const SampleKey& key, std::string_view name,
                         Scratch& scratch) const;
  // The final layout step: CHW, uint8 or float32 (normalised), mirrored when
  // the flip was left to it.
  void emit(const Image& image, Mirror mirror, std::byte* out) const;

  TransformSpec spec_;
  // The ops transform() runs; an hflip last but for normalize is left out,
  // and emit() mirrors as it writes instead (one pass over the pixels).
  std::size_t pixel_ops_ = 0;
};

}  // namespace dlop::media
