#include "media/batch_maker.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <exception>
#include <functional>

#include "core/error.hpp"
#include "media/audio.hpp"
#include "media/image.hpp"
#include "media/image_pipeline.hpp"
#include "media/video.hpp"

#include "../source/concrete_sources.hpp"

namespace dlop::media {

std::size_t SampleLayout::elements() const {
  std::size_t n = 1;
  for (const std::uint32_t d : shape) n *= d;
  return n;
}

std::unique_ptr<BatchMaker> make_batch_maker(std::string_view spec_json) {
  nlohmann::json spec;
  try {
    spec = nlohmann::json::parse(spec_json);
  } catch (const nlohmann::json::exception& e) {
    throw_error(Errc::kInvalidArgument, fmt::format("transform spec: not JSON: {}", e.what()));
  }
  std::string kind = "image";
  if (spec.is_object() && spec.contains("kind")) {
    if (!spec["kind"].is_string()) throw_error(Errc::kInvalidArgument, "transform spec: \"kind\" must be a string");
    kind = spec["kind"].get<std::string>();
    spec.erase("kind");
  }
  if (kind == "image") return std::make_unique<ImagePipeline>(TransformSpec::from_json(spec.dump()));
  if (kind == "video") return make_clip_pipeline(spec.dump());
  if (kind == "audio") return make_audio_pipeline(spec.dump());
  throw_error(Errc::kInvalidArgument,
              fmt::format("transform spec: kind {:?} is not one of \"image\", \"video\", \"audio\"", kind));
}

void write_labels(const Source& source, std::uint64_t index, std::span<std::int64_t> out) {
  if (out.size() == 1) {
    out[0] = source.label(index);
    return;
  }
  std::fill(out.begin(), out.end(), 0);
  for (const std::int64_t c : source.labels(index)) {
    if (c >= 0 && static_cast<std::size_t>(c) < out.size()) out[static_cast<std::size_t>(c)] = 1;
  }
}

BatchResult run_samples(const Source& source, std::span<const std::uint64_t> indices, const SampleLayout& layout,
                        const BatchOut& out, ErrorPolicy on_error, WorkerPool* pool, const MakeSample& make) {
  const std::size_t n = indices.size();
  const std::size_t sample_bytes = layout.sample_bytes();
  const std::size_t width = layout.label_width;
  if (out.samples.size() < n * sample_bytes || out.labels.size() < n * width ||
      (layout.lengths && out.lengths.size() < n)) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("run_batch: buffers too small for {} samples of {} bytes ({} bytes, {} labels, {} lengths "
                            "given)",
                            n, sample_bytes, out.samples.size(), out.labels.size(), out.lengths.size()));
  }
  for (const std::uint64_t index : indices) {
    if (index >= source.size()) {
      throw_error(Errc::kInvalidArgument,
                  fmt::format("run_batch: index {} out of range (the source has {} samples)", index, source.size()));
    }
  }

  BatchResult result;
  const auto start = std::chrono::steady_clock::now();
  const BatchReads reads(source, indices);
  result.seconds.read += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::exception_ptr> failures(n);
  const auto one = [&](std::size_t k, std::size_t worker, StageTimes& times) {
    try {
      make(reads, k, worker, times);
    } catch (const SampleError& e) {
      // Makers may throw without the name: it is only looked up on failure.
      failures[k] = e.sample().empty() ? std::make_exception_ptr(SampleError(source.name(indices[k]), e.reason()))
                                       : std::current_exception();
    }
  };
  if (pool == nullptr || pool->threads() == 1 || n < 2) {
    for (std::size_t k = 0; k < n; ++k) one(k, 0, result.seconds);
  } else {
    std::vector<StageTimes> times(pool->threads());
    pool->parallel_for(n, [&](std::size_t k, std::size_t worker) { one(k, worker, times[worker]); });
    for (const StageTimes& t : times) result.seconds += t;
  }

  for (std::size_t k = 0; k < n; ++k) {
    if (!failures[k]) {
      if (result.count != k) {
        const std::size_t to = result.count;
        std::memmove(out.samples.data() + to * sample_bytes, out.samples.data() + k * sample_bytes, sample_bytes);
        std::copy_n(out.labels.begin() + static_cast<std::ptrdiff_t>(k * width), width,
                    out.labels.begin() + static_cast<std::ptrdiff_t>(to * width));
        if (layout.lengths) out.lengths[to] = out.lengths[k];
      }
      ++result.count;
      continue;
    }
    if (on_error == ErrorPolicy::kRaise) std::rethrow_exception(failures[k]);
    try {
      std::rethrow_exception(failures[k]);
    } catch (const SampleError& e) {
      result.skipped.push_back(SkippedSample{indices[k], e.what()});
    }
  }
  return result;
}

}  // namespace dlop::media
