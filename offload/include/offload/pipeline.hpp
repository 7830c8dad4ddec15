// Runs a TransformSpec: one sample's encoded bytes to a CHW tensor, or a
// batch of a Source's samples into one N x C x H x W buffer with labels.
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

#include "offload/image.hpp"
#include "offload/random.hpp"
#include "offload/source.hpp"
#include "offload/spec.hpp"

namespace dlop::offload {

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

struct SkippedSample {
  std::uint64_t index;
  std::string reason;  // the SampleError's message
};

// Wall seconds spent per stage, summed over the samples of a batch (and so
// over its threads): for the per-stage throughput a daemon reports.
struct StageTimes {
  double read = 0;     // Source::read
  double decode = 0;   // JPEG/PNG to RGB
  double augment = 0;  // the ops
  double collate = 0;  // CHW layout into the batch buffer
  StageTimes& operator+=(const StageTimes& o) {
    read += o.read;
    decode += o.decode;
    augment += o.augment;
    collate += o.collate;
    return *this;
  }
};

struct BatchResult {
  std::size_t count = 0;  // samples written (at the front of the buffers, in order)
  std::vector<SkippedSample> skipped;
  StageTimes seconds;
};

// A fixed set of threads that run parallel loops; the calling thread works
// too, so WorkerPool(1) has no extra thread.
class WorkerPool {
 public:
  explicit WorkerPool(std::size_t threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  std::size_t threads() const;
  // Runs fn(i, worker) for i in 0 .. n-1, each once, spread over the threads;
  // worker (< threads()) tells which thread runs it, for per-thread scratch.
  // Returns when all are done, rethrowing the first exception thrown (the
  // other items still run). One loop at a time.
  void parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Pipeline {
 public:
  explicit Pipeline(TransformSpec spec);  // validates
  static Pipeline from_json(std::string_view json) { return Pipeline(TransformSpec::from_json(json)); }

  const TransformSpec& spec() const { return spec_; }
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
  };
  // Decodes and runs the geometric ops; the result is in scratch.a or .b.
  const Image& transform(std::span<const std::uint8_t> encoded, const SampleKey& key, std::string_view name,
                         Scratch& scratch) const;
  // The final layout step: CHW, uint8 or float32 (normalised).
  void emit(const Image& image, std::byte* out) const;

  TransformSpec spec_;
};

}  // namespace dlop::offload
