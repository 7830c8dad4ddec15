// Audio (libsndfile, soxr, kissfft): decoding, resampling and log-mel
// features with SpecAugment, each step callable on its own (the tests check
// every one against a reference), and the audio pipeline, the batch maker of
// the "audio" transform spec.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/random.hpp"
#include "media/batch_maker.hpp"
#include "media/source.hpp"

namespace dlop::media {

enum class MelScale { kHtk, kSlaney };
enum class AudioCrop { kRandom, kStart, kCenter };

// The "audio" spec, e.g.
//   {"kind": "audio", "sample_rate": 16000, "seconds": 4, "crop": "random",
//    "n_fft": 400, "hop": 160, "n_mels": 80, "mel_scale": "slaney",
//    "freq_masks": 2, "freq_mask_width": 27, "time_masks": 2, "time_mask_width": 40}
struct AudioSpec {
  int sample_rate = 16000;  // resampled to this, then cropped
  double seconds = 0;       // crop length (required, > 0): fixes the most frames a sample has
  AudioCrop crop = AudioCrop::kRandom;
  int n_fft = 400;
  int win_length = 0;  // 0: n_fft; a Hann window of this length, centred in n_fft
  int hop = 160;
  int n_mels = 80;
  double f_min = 0;
  double f_max = 0;  // 0: sample_rate / 2
  MelScale mel_scale = MelScale::kHtk;
  bool slaney_norm = false;  // each filter scaled to unit area (librosa's norm="slaney")
  bool log = true;           // ln(mel + log_offset)
  double log_offset = 1e-6;
  bool normalize = true;  // per utterance: zero mean, unit variance over its real frames
  int freq_masks = 0;
  int freq_mask_width = 0;  // each mask's width is uniform in [0, this]
  int time_masks = 0;
  int time_mask_width = 0;
  ErrorPolicy on_error = ErrorPolicy::kRaise;

  // Throws dlop::Error(kInvalidArgument) naming the field.
  static AudioSpec from_json(std::string_view json);
  std::string to_json() const;
  void validate() const;
  int crop_samples() const;  // seconds x sample_rate
  int max_frames() const;    // STFT frames of a full crop
};

// Decoded audio, channels interleaved.
struct Audio {
  int sample_rate = 0;
  int channels = 0;
  std::vector<float> samples;  // frames x channels
  std::size_t frames() const { return channels == 0 ? 0 : samples.size() / static_cast<std::size_t>(channels); }
};

// What a file's header says, for reading only the part a crop needs.
struct AudioHeader {
  int sample_rate = 0;
  int channels = 0;
  std::int64_t frames = -1;  // -1: not known exactly (MP3's is an estimate; a streamed FLAC has none)
};
AudioHeader read_audio_header(std::span<const std::uint8_t> bytes, std::string_view name);
// Frames [first, last) of the file (last clipped to its end).
Audio decode_audio_frames(std::span<const std::uint8_t> bytes, std::string_view name, std::int64_t first,
                          std::int64_t last);

// Any format libsndfile reads (WAV, FLAC, Ogg Vorbis/Opus, MP3), from memory;
// only [span.start, span.end) seconds when a span is given. Throws
// SampleError naming `name` for an unreadable, unsupported or empty file.
Audio decode_audio(std::span<const std::uint8_t> bytes, std::string_view name, TimeSpan span = {});
// The mean of the channels.
std::vector<float> downmix(const Audio& audio);
// soxr's high-quality resampler; the same rate returns the input.
std::vector<float> resample(std::span<const float> mono, int from_rate, int to_rate);
// The crop's first sample: 0, the centre, or uniform from `rng`; 0 when the
// signal is no longer than the crop.
std::size_t crop_start(std::size_t length, std::size_t crop, AudioCrop how, SampleRng& rng);

// The mono signal at the spec's rate that a sample's features are made of:
// resampled, then cropped (at most crop_samples()).
std::vector<float> audio_crop(std::span<const std::uint8_t> bytes, const AudioSpec& spec, const SampleKey& key,
                              TimeSpan span, std::string_view name = "");

// n_mels x (n_fft / 2 + 1) triangular filters over the STFT's bins.
std::vector<float> mel_filter_bank(const AudioSpec& spec);
// Power spectrogram |STFT|^2, frames x (n_fft / 2 + 1), row-major: centred
// frames (the signal reflect-padded by n_fft / 2), periodic Hann window of
// win_length centred in n_fft.
std::vector<float> power_spectrogram(std::span<const float> signal, const AudioSpec& spec, std::size_t& frames);
// mels x frames = filters x power^T, then ln(x + log_offset) and
// (x - mean) / (std + 1e-5) over the whole utterance, as the spec says.
std::vector<float> log_mel(std::span<const float> power, std::size_t frames, std::span<const float> filters,
                           const AudioSpec& spec);
// Frequency and time masks (set to 0) on a mels x frames feature, drawn from rng.
void spec_augment(std::span<float> features, std::size_t frames, const AudioSpec& spec, SampleRng& rng);

// The features of one sample's bytes: n_mels x frames, frames <= max_frames().
std::vector<float> audio_features(std::span<const std::uint8_t> bytes, const AudioSpec& spec, const SampleKey& key,
                                  TimeSpan span, std::size_t& frames, std::string_view name = "");

// Samples are {n_mels, max_frames} float32 with their lengths (real frames).
std::unique_ptr<BatchMaker> make_audio_pipeline(std::string_view spec_json);

}  // namespace dlop::media
