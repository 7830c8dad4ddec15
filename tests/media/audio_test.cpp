// The audio batch maker at the edges of its sizes (a 1-sample file, a file
// shorter than the FFT, odd FFT sizes, crops longer and shorter than the
// file) so the sanitizer builds check its memory handling; the values
// themselves are checked against torch.stft and numpy in
// tests/python/test_offload_audio.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>

#include "media/audio.hpp"
#include "source/concrete_sources.hpp"
#include "test_data.hpp"

namespace dlop::media {
namespace {

namespace fs = std::filesystem;

// A 16-bit PCM WAV of `frames` frames of a sine, by hand.
std::vector<std::uint8_t> wav(std::size_t frames, int rate, int channels) {
  std::vector<std::uint8_t> b;
  const auto put = [&](std::uint32_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  const auto data = static_cast<std::uint32_t>(frames * static_cast<std::size_t>(channels) * 2);
  b.insert(b.end(), {'R', 'I', 'F', 'F'});
  put(36 + data, 4);
  b.insert(b.end(), {'W', 'A', 'V', 'E', 'f', 'm', 't', ' '});
  put(16, 4);
  put(1, 2);
  put(static_cast<std::uint32_t>(channels), 2);
  put(static_cast<std::uint32_t>(rate), 4);
  put(static_cast<std::uint32_t>(rate * channels * 2), 4);
  put(static_cast<std::uint32_t>(channels * 2), 2);
  put(16, 2);
  b.insert(b.end(), {'d', 'a', 't', 'a'});
  put(data, 4);
  for (std::size_t f = 0; f < frames; ++f) {
    const double x = 0.4 * std::sin(2 * std::numbers::pi * 440.0 * static_cast<double>(f) / rate);
    for (int c = 0; c < channels; ++c) put(static_cast<std::uint16_t>(static_cast<std::int16_t>(x * 32767)), 2);
  }
  return b;
}

struct Case {
  std::size_t frames;
  int rate, channels, n_fft, hop;
};

TEST(AudioBatch, EdgeSizesFillTheirLengthsAndPadWithZeros) {
  test::TempDir dir;
  const std::vector<Case> cases = {{1, 16000, 1, 400, 160},  {150, 8000, 2, 401, 100}, {16000, 44100, 2, 512, 128},
                                   {48000, 48000, 1, 64, 64}, {7, 22050, 1, 3, 1}};
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    SCOPED_TRACE(k);
    const fs::path root = dir.path() / std::to_string(k);
    test::write_file(root / "a" / "x.wav", wav(c.frames, c.rate, c.channels));
    test::write_file(root / "b" / "y.wav", wav(c.frames * 3 + 1, c.rate, c.channels));
    const FolderSource source(root, MediaKind::kAudio);
    const std::string spec = R"({"kind": "audio", "seconds": 0.5, "n_fft": )" + std::to_string(c.n_fft) +
                             R"(, "hop": )" + std::to_string(c.hop) +
                             R"(, "n_mels": 16, "freq_masks": 2, "freq_mask_width": 16, "time_masks": 2, "time_mask_width": 1000})";
    const auto maker = make_batch_maker(spec);
    const SampleLayout l = maker->layout(source);
    ASSERT_TRUE(l.lengths);
    ASSERT_EQ(l.shape.size(), 2u);
    std::vector<float> samples(2 * l.elements(), -1.0f);
    std::vector<std::int64_t> labels(2), lengths(2);
    const std::vector<std::uint64_t> indices{0, 1};
    WorkerPool pool(2);
    const BatchOut out{{reinterpret_cast<std::byte*>(samples.data()), samples.size() * sizeof(float)}, labels, lengths};
    const BatchResult r = maker->run_batch(source, indices, 1, 0, out, &pool);
    ASSERT_EQ(r.count, 2u);
    EXPECT_EQ(labels, (std::vector<std::int64_t>{0, 1}));
    for (std::size_t s = 0; s < 2; ++s) {
      ASSERT_GT(lengths[s], 0);
      ASSERT_LE(static_cast<std::uint32_t>(lengths[s]), l.shape[1]);
      for (std::uint32_t m = 0; m < l.shape[0]; ++m) {
        for (std::uint32_t t = 0; t < l.shape[1]; ++t) {
          const float v = samples[s * l.elements() + m * l.shape[1] + t];
          ASSERT_TRUE(std::isfinite(v));
          if (t >= lengths[s]) {
            ASSERT_EQ(v, 0.0f) << "padding at mel " << m << " frame " << t;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dlop::media
