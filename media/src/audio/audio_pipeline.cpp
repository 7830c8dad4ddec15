// The "audio" batch maker: decode, downmix, resample, crop, log-mel,
// SpecAugment, then each sample padded with zeros to the spec's most frames,
// its real length beside it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <cstring>

#include "media/audio.hpp"

namespace dlop::media {
namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Independent random streams of one sample, so a new draw in one step never
// shifts another's.
constexpr std::uint64_t kCropStream = 1;
constexpr std::uint64_t kMaskStream = 2;

struct Timed {
  std::vector<float> features;
  std::size_t frames = 0;
};

// The crop's samples. When the header gives the exact length, only the part
// the crop needs is decoded and resampled, with a margin on each side for
// the resampler's filter; the margin is a whole number of resampling periods
// (from / gcd source samples = to / gcd output samples), so output samples
// fall on the same instants as when the whole file is resampled. Otherwise
// (MP3, a streamed FLAC) the whole span is.
}  // namespace

std::vector<float> audio_crop(std::span<const std::uint8_t> bytes, const AudioSpec& spec, const SampleKey& key,
                              TimeSpan span, std::string_view name) {
  SampleRng rng(key, kCropStream);
  const auto crop = static_cast<std::size_t>(spec.crop_samples());
  const AudioHeader h = read_audio_header(bytes, name);
  if (h.frames < 0) {
    const Audio audio = decode_audio(bytes, name, span);
    std::vector<float> signal = resample(downmix(audio), audio.sample_rate, spec.sample_rate);
    const std::size_t first = crop_start(signal.size(), crop, spec.crop, rng);
    signal.erase(signal.begin(), signal.begin() + static_cast<std::ptrdiff_t>(first));
    signal.resize(std::min(crop, signal.size()));
    return signal;
  }
  const std::int64_t from = h.sample_rate, to = spec.sample_rate;
  const std::int64_t a = span.start > 0 ? static_cast<std::int64_t>(std::floor(span.start * from)) : 0;
  const std::int64_t b = span.end >= 0 ? std::min(h.frames, static_cast<std::int64_t>(std::ceil(span.end * from))) : h.frames;
  if (b <= a) throw SampleError(std::string(name), span.start > 0 || span.end >= 0 ? "no audio in its time span" : "no audio samples");
  const std::int64_t g = std::gcd(from, to), step_in = from / g, step_out = to / g;
  const auto length = static_cast<std::size_t>((b - a) * to / from);  // output samples the span resamples to
  const auto start = static_cast<std::int64_t>(crop_start(length, crop, spec.crop, rng));
  constexpr std::int64_t kMarginOut = 512;  // output samples: beyond soxr HQ's filter
  const std::int64_t margin = (kMarginOut + step_out - 1) / step_out;  // in periods
  const std::int64_t first_period = std::max<std::int64_t>(0, start / step_out - margin);
  const std::int64_t last_period = (start + static_cast<std::int64_t>(crop) + step_out - 1) / step_out + margin;
  const std::int64_t first = a + first_period * step_in;
  const std::int64_t last = std::min(b, a + last_period * step_in);
  const Audio audio = decode_audio_frames(bytes, name, first, last);
  std::vector<float> signal = resample(downmix(audio), audio.sample_rate, spec.sample_rate);
  const auto skip = static_cast<std::size_t>(std::min<std::int64_t>(start - first_period * step_out,
                                                                    static_cast<std::int64_t>(signal.size())));
  signal.erase(signal.begin(), signal.begin() + static_cast<std::ptrdiff_t>(skip));
  signal.resize(std::min({crop, signal.size(), length - static_cast<std::size_t>(start)}));
  return signal;
}

namespace {

Timed features_of(std::span<const std::uint8_t> bytes, const AudioSpec& spec, std::span<const float> filters,
                  const SampleKey& key, TimeSpan span, std::string_view name, StageTimes& times) {
  const auto start = Clock::now();
  const std::vector<float> cropped = audio_crop(bytes, spec, key, span, name);
  const auto decoded = Clock::now();
  Timed out;
  const std::vector<float> power = power_spectrogram(cropped, spec, out.frames);
  out.features = log_mel(power, out.frames, filters, spec);
  SampleRng mask_rng(key, kMaskStream);
  spec_augment(out.features, out.frames, spec, mask_rng);
  times.decode += seconds(decoded - start);
  times.decoded_bytes += cropped.size() * sizeof(float);
  times.augment += seconds(Clock::now() - decoded);
  return out;
}

class AudioPipeline final : public BatchMaker {
 public:
  explicit AudioPipeline(AudioSpec spec) : spec_(spec), filters_(mel_filter_bank(spec_)) {}

  std::string_view kind() const override { return "audio"; }
  ErrorPolicy on_error() const override { return spec_.on_error; }
  std::string to_json() const override { return spec_.to_json(); }

  SampleLayout layout(const Source& source) const override {
    SampleLayout l;
    l.shape = {static_cast<std::uint32_t>(spec_.n_mels), static_cast<std::uint32_t>(spec_.max_frames())};
    l.label_width = source.multi_label() ? static_cast<std::uint32_t>(source.classes().size()) : 1;
    l.lengths = true;
    return l;
  }

  BatchResult run_batch(const Source& source, std::span<const std::uint64_t> indices, std::uint64_t seed,
                        std::uint64_t epoch, const BatchOut& out, WorkerPool* pool) const override {
    const SampleLayout l = layout(source);
    const std::size_t mels = l.shape[0], most = l.shape[1];
    std::vector<std::vector<std::uint8_t>> scratch(pool != nullptr ? pool->threads() : 1);
    return run_samples(source, indices, l, out, spec_.on_error, pool,
                       [&](const Source& from, std::size_t k, std::size_t worker, StageTimes& times) {
                         const std::uint64_t index = indices[k];
                         const auto start = Clock::now();
                         const auto bytes = from.read(index, scratch[worker]);
                         times.read += seconds(Clock::now() - start);
                         times.read_bytes += bytes.size();
                         const Timed f = features_of(bytes, spec_, filters_, SampleKey{seed, epoch, index},
                                                     from.time_span(index), {}, times);
                         const auto made = Clock::now();
                         auto* dst = reinterpret_cast<float*>(out.samples.data() + k * l.sample_bytes());
                         for (std::size_t m = 0; m < mels; ++m) {
                           std::memcpy(dst + m * most, f.features.data() + m * f.frames, f.frames * sizeof(float));
                           std::memset(dst + m * most + f.frames, 0, (most - f.frames) * sizeof(float));
                         }
                         out.lengths[k] = static_cast<std::int64_t>(f.frames);
                         write_labels(from, index, out.labels.subspan(k * l.label_width, l.label_width));
                         times.collate += seconds(Clock::now() - made);
                       });
  }

 private:
  AudioSpec spec_;
  std::vector<float> filters_;
};

}  // namespace

std::vector<float> audio_features(std::span<const std::uint8_t> bytes, const AudioSpec& spec, const SampleKey& key,
                                  TimeSpan span, std::size_t& frames, std::string_view name) {
  StageTimes unused;
  Timed t = features_of(bytes, spec, mel_filter_bank(spec), key, span, name, unused);
  frames = t.frames;
  return std::move(t.features);
}

std::unique_ptr<BatchMaker> make_audio_pipeline(std::string_view spec_json) {
  return std::make_unique<AudioPipeline>(AudioSpec::from_json(spec_json));
}

}  // namespace dlop::media
