// Log-mel features: STFT (kissfft), mel filter bank, log, per-utterance
// normalisation and SpecAugment. The conventions are torch's and
// torchaudio's (centred reflect-padded frames, periodic Hann window centred in
// n_fft, torchaudio.functional.melscale_fbanks), so users can compare.
#include <kiss_fft.h>
#include <kiss_fftr.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.hpp"
#include "media/audio.hpp"

namespace dlop::media {
namespace {

double hz_to_mel(double hz, MelScale scale) {
  if (scale == MelScale::kHtk) return 2595.0 * std::log10(1.0 + hz / 700.0);
  constexpr double f_sp = 200.0 / 3, min_log_hz = 1000, min_log_mel = min_log_hz / f_sp;
  const double logstep = std::log(6.4) / 27.0;
  return hz >= min_log_hz ? min_log_mel + std::log(hz / min_log_hz) / logstep : hz / f_sp;
}

double mel_to_hz(double mel, MelScale scale) {
  if (scale == MelScale::kHtk) return 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0);
  constexpr double f_sp = 200.0 / 3, min_log_hz = 1000, min_log_mel = min_log_hz / f_sp;
  const double logstep = std::log(6.4) / 27.0;
  return mel >= min_log_mel ? min_log_hz * std::exp(logstep * (mel - min_log_mel)) : f_sp * mel;
}

// numpy's "reflect" padding, repeated for signals shorter than the pad.
std::size_t reflect(std::ptrdiff_t i, std::size_t n) {
  if (n == 1) return 0;
  const auto period = static_cast<std::ptrdiff_t>(2 * (n - 1));
  std::ptrdiff_t k = i % period;
  if (k < 0) k += period;
  return static_cast<std::size_t>(k < static_cast<std::ptrdiff_t>(n) ? k : period - k);
}

// kissfft's plans are made per call: they cost microseconds against the
// milliseconds of a spectrogram, and so need no cache shared across threads.
struct Fft {
  explicit Fft(int size) : n(size) {
    if (n % 2 == 0) {
      real = kiss_fftr_alloc(n, 0, nullptr, nullptr);
    } else {
      complex = kiss_fft_alloc(n, 0, nullptr, nullptr);
      in.resize(static_cast<std::size_t>(n));
    }
    out.resize(static_cast<std::size_t>(n));
    if (real == nullptr && complex == nullptr) throw std::bad_alloc();
  }
  ~Fft() {
    kiss_fftr_free(real);
    kiss_fft_free(complex);
  }
  Fft(const Fft&) = delete;
  Fft& operator=(const Fft&) = delete;
  // Bins 0 .. n / 2 of the frame's spectrum, in out.
  void run(const float* frame) {
    if (real != nullptr) return kiss_fftr(real, frame, out.data());
    for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = {frame[i], 0.0f};
    kiss_fft(complex, in.data(), out.data());
  }
  int n;
  kiss_fftr_cfg real = nullptr;
  kiss_fft_cfg complex = nullptr;
  std::vector<kiss_fft_cpx> in, out;
};

}  // namespace

std::vector<float> mel_filter_bank(const AudioSpec& spec) {
  const std::size_t bins = static_cast<std::size_t>(spec.n_fft / 2 + 1);
  const auto mels = static_cast<std::size_t>(spec.n_mels);
  const double f_max = spec.f_max == 0 ? spec.sample_rate / 2.0 : spec.f_max;
  const double m_min = hz_to_mel(spec.f_min, spec.mel_scale), m_max = hz_to_mel(f_max, spec.mel_scale);
  std::vector<double> f_pts(mels + 2);
  for (std::size_t i = 0; i < mels + 2; ++i) {
    f_pts[i] = mel_to_hz(m_min + (m_max - m_min) * static_cast<double>(i) / static_cast<double>(mels + 1), spec.mel_scale);
  }
  std::vector<float> bank(mels * bins);
  for (std::size_t m = 0; m < mels; ++m) {
    const double scale = spec.slaney_norm ? 2.0 / (f_pts[m + 2] - f_pts[m]) : 1.0;
    for (std::size_t b = 0; b < bins; ++b) {
      const double f = bins == 1 ? 0.0 : (spec.sample_rate / 2.0) * static_cast<double>(b) / static_cast<double>(bins - 1);
      const double down = (f - f_pts[m]) / (f_pts[m + 1] - f_pts[m]);
      const double up = (f_pts[m + 2] - f) / (f_pts[m + 2] - f_pts[m + 1]);
      bank[m * bins + b] = static_cast<float>(std::max(0.0, std::min(down, up)) * scale);
    }
  }
  return bank;
}

std::vector<float> power_spectrogram(std::span<const float> signal, const AudioSpec& spec, std::size_t& frames) {
  const auto n_fft = static_cast<std::size_t>(spec.n_fft);
  const std::size_t bins = n_fft / 2 + 1;
  const std::size_t pad = n_fft / 2;
  const std::size_t padded = signal.size() + 2 * pad;
  frames = padded < n_fft ? 0 : 1 + (padded - n_fft) / static_cast<std::size_t>(spec.hop);
  std::vector<float> power(frames * bins);
  if (frames == 0 || signal.empty()) return power;

  const std::size_t win = spec.win_length == 0 ? n_fft : static_cast<std::size_t>(spec.win_length);
  std::vector<float> window(n_fft, 0.0f);
  for (std::size_t i = 0; i < win; ++i) {
    window[(n_fft - win) / 2 + i] =
        static_cast<float>(0.5 - 0.5 * std::cos(2.0 * std::numbers::pi * static_cast<double>(i) / static_cast<double>(win)));
  }
  Fft fft(spec.n_fft);
  std::vector<float> frame(n_fft);
  for (std::size_t t = 0; t < frames; ++t) {
    const std::size_t begin = t * static_cast<std::size_t>(spec.hop);  // in the padded signal
    for (std::size_t i = 0; i < n_fft; ++i) {
      const auto at = static_cast<std::ptrdiff_t>(begin + i) - static_cast<std::ptrdiff_t>(pad);
      const bool inside = at >= 0 && at < static_cast<std::ptrdiff_t>(signal.size());
      frame[i] = window[i] * signal[inside ? static_cast<std::size_t>(at) : reflect(at, signal.size())];
    }
    fft.run(frame.data());
    float* row = power.data() + t * bins;
    for (std::size_t b = 0; b < bins; ++b) row[b] = fft.out[b].r * fft.out[b].r + fft.out[b].i * fft.out[b].i;
  }
  return power;
}

std::vector<float> log_mel(std::span<const float> power, std::size_t frames, std::span<const float> filters,
                           const AudioSpec& spec) {
  const auto mels = static_cast<std::size_t>(spec.n_mels);
  const std::size_t bins = static_cast<std::size_t>(spec.n_fft / 2 + 1);
  if (power.size() != frames * bins || filters.size() != mels * bins) {
    throw_error(Errc::kInvalidArgument, "log_mel: power or filters do not match the spec's n_fft and n_mels");
  }
  // Each triangle covers a few bins: only those are summed.
  std::vector<std::pair<std::size_t, std::size_t>> support(mels, {0, 0});
  for (std::size_t m = 0; m < mels; ++m) {
    const float* f = filters.data() + m * bins;
    std::size_t lo = 0, hi = bins;
    while (lo < bins && f[lo] == 0.0f) ++lo;
    while (hi > lo && f[hi - 1] == 0.0f) --hi;
    support[m] = {lo, hi};
  }
  std::vector<float> out(mels * frames);
  for (std::size_t t = 0; t < frames; ++t) {
    const float* p = power.data() + t * bins;
    for (std::size_t m = 0; m < mels; ++m) {
      const float* f = filters.data() + m * bins;
      float sum = 0;
      for (std::size_t b = support[m].first; b < support[m].second; ++b) sum += f[b] * p[b];
      out[m * frames + t] = spec.log ? static_cast<float>(std::log(static_cast<double>(sum) + spec.log_offset)) : sum;
    }
  }
  if (spec.normalize && !out.empty()) {
    double sum = 0, sq = 0;
    for (const float v : out) sum += v;
    const double mean = sum / static_cast<double>(out.size());
    for (const float v : out) sq += (v - mean) * (v - mean);
    // The small floor keeps a silent utterance (zero variance) finite.
    const double scale = 1.0 / (std::sqrt(sq / static_cast<double>(out.size())) + 1e-5);
    for (float& v : out) v = static_cast<float>((v - mean) * scale);
  }
  return out;
}

void spec_augment(std::span<float> features, std::size_t frames, const AudioSpec& spec, SampleRng& rng) {
  const auto mels = static_cast<std::size_t>(spec.n_mels);
  for (int k = 0; k < spec.freq_masks; ++k) {
    const auto width = static_cast<std::size_t>(rng.randint(0, spec.freq_mask_width + 1));
    const auto first = static_cast<std::size_t>(rng.randint(0, static_cast<std::int64_t>(mels - width) + 1));
    for (std::size_t m = first; m < first + width; ++m) std::fill_n(features.begin() + static_cast<std::ptrdiff_t>(m * frames), frames, 0.0f);
  }
  for (int k = 0; k < spec.time_masks; ++k) {
    const auto most = std::min<std::size_t>(static_cast<std::size_t>(spec.time_mask_width), frames);
    const auto width = static_cast<std::size_t>(rng.randint(0, static_cast<std::int64_t>(most) + 1));
    const auto first = static_cast<std::size_t>(rng.randint(0, static_cast<std::int64_t>(frames - width) + 1));
    for (std::size_t m = 0; m < mels; ++m) {
      std::fill_n(features.begin() + static_cast<std::ptrdiff_t>(m * frames + first), width, 0.0f);
    }
  }
}

}  // namespace dlop::media
