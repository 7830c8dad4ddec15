// A batch maker turns samples of a Source into one batch buffer: images
// (ImagePipeline), video clips (ClipPipeline, video.hpp) or audio features
// (AudioPipeline, audio.hpp). The transform spec's "kind" picks one, and the
// daemon, the trainer's local fallback and the tests drive them all through
// this interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "media/source.hpp"
#include "media/image_spec.hpp"

namespace dlop::media {

struct SkippedSample {
  std::uint64_t index;
  std::string reason;  // the SampleError's message
};

// Wall seconds spent per stage, and the bytes read and decoded, summed over
// the samples of a batch (and so over its threads): for the per-stage
// throughput a daemon reports.
struct StageTimes {
  double read = 0;     // Source::read
  double decode = 0;   // compressed bytes to pixels or samples
  double augment = 0;  // the ops
  double collate = 0;  // the final layout into the batch buffer
  std::uint64_t read_bytes = 0;     // encoded bytes Source::read gave (a sample file's size)
  std::uint64_t decoded_bytes = 0;  // what they decoded to: RGB bytes, or float audio samples
  StageTimes& operator+=(const StageTimes& o) {
    read += o.read;
    decode += o.decode;
    augment += o.augment;
    collate += o.collate;
    read_bytes += o.read_bytes;
    decoded_bytes += o.decoded_bytes;
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

// What one sample of a batch is, the same for every sample of a spec and
// source: the batch buffer holds N samples of `shape` back to back.
struct SampleLayout {
  std::vector<std::uint32_t> shape;  // {3, H, W}; {views, C, T, H, W} or {views, T, C, H, W}; {mels, frames}
  OutputType dtype = OutputType::kFloat32;
  // int64 labels per sample: 1 (a class index), or the class count for a
  // multi-label source (a multi-hot vector of 0 and 1).
  std::uint32_t label_width = 1;
  // One int64 per sample: how much of the last axis is real (audio frames);
  // the rest of it is zero padding.
  bool lengths = false;

  std::size_t elements() const;
  std::size_t element_size() const { return dtype == OutputType::kUint8 ? 1 : 4; }
  std::size_t sample_bytes() const { return elements() * element_size(); }
  bool operator==(const SampleLayout&) const = default;
};

// Where a batch of N samples goes.
struct BatchOut {
  std::span<std::byte> samples;     // N x sample_bytes
  std::span<std::int64_t> labels;   // N x label_width
  std::span<std::int64_t> lengths;  // N when the layout has lengths, else empty
};

class BatchMaker {
 public:
  virtual ~BatchMaker() = default;
  virtual std::string_view kind() const = 0;  // "image", "video" or "audio"
  virtual ErrorPolicy on_error() const = 0;
  // The spec as JSON, "kind" included: what a daemon is configured with.
  virtual std::string to_json() const = 0;
  // This spec's samples from `source`. Throws dlop::Error(kInvalidArgument)
  // when they would not all have one shape (an image spec that does not end
  // in a fixed size).
  virtual SampleLayout layout(const Source& source) const = 0;
  // Samples `indices` of `source` into `out`. With the skip policy,
  // unreadable samples are left out and the others moved up, in order; with
  // raise, the first failure (in index order) is thrown. Each sample's
  // randomness is drawn from {seed, epoch, its index} only. `pool` may be
  // null (this thread).
  virtual BatchResult run_batch(const Source& source, std::span<const std::uint64_t> indices, std::uint64_t seed,
                                std::uint64_t epoch, const BatchOut& out, WorkerPool* pool) const = 0;
};

// Parses a transform spec: {"kind": "image" (the default), "video" or
// "audio", ...}; the rest is that kind's spec.
std::unique_ptr<BatchMaker> make_batch_maker(std::string_view spec_json);

// The loop every batch maker shares: checks the buffers and indices, reads
// the batch's neighbouring samples ahead (BatchReads), runs
// make(from, k, worker, times) for each sample k (reading it from `from`,
// writing sample k, its labels and length into `out`) on the pool, then
// applies the error policy to the SampleErrors thrown and moves the kept
// samples up.
using MakeSample = std::function<void(const Source& from, std::size_t k, std::size_t worker, StageTimes& times)>;
BatchResult run_samples(const Source& source, std::span<const std::uint64_t> indices, const SampleLayout& layout,
                        const BatchOut& out, ErrorPolicy on_error, WorkerPool* pool, const MakeSample& make);

// Writes sample `index`'s labels as the layout wants them: its class, or a
// multi-hot vector of label_width.
void write_labels(const Source& source, std::uint64_t index, std::span<std::int64_t> out);

}  // namespace dlop::media
