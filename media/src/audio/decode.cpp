// Decoding from memory with libsndfile's virtual I/O, and soxr resampling.
#include <sndfile.h>
#include <soxr.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "media/audio.hpp"
#include "core/error.hpp"
#include "media/image.hpp"

namespace dlop::media {
namespace {

struct Memory {
  std::span<const std::uint8_t> bytes;
  sf_count_t at = 0;
};

sf_count_t mem_length(void* user) { return static_cast<sf_count_t>(static_cast<Memory*>(user)->bytes.size()); }
sf_count_t mem_seek(sf_count_t offset, int whence, void* user) {
  auto* m = static_cast<Memory*>(user);
  const sf_count_t size = static_cast<sf_count_t>(m->bytes.size());
  sf_count_t to = whence == SEEK_SET ? offset : whence == SEEK_CUR ? m->at + offset : size + offset;
  m->at = std::clamp<sf_count_t>(to, 0, size);
  return m->at;
}
sf_count_t mem_read(void* out, sf_count_t count, void* user) {
  auto* m = static_cast<Memory*>(user);
  const sf_count_t n = std::clamp<sf_count_t>(static_cast<sf_count_t>(m->bytes.size()) - m->at, 0, count);
  std::memcpy(out, m->bytes.data() + m->at, static_cast<std::size_t>(n));
  m->at += n;
  return n;
}
sf_count_t mem_write(const void*, sf_count_t, void*) { return 0; }

// libsndfile reads a cut WAV as a shorter one (its frame count shrinks to
// what is there), so the cut is found here: the data chunk's size against
// the bytes after it. A size of 0 or 0xffffffff is a writer's "unknown".
bool wav_data_cut(std::span<const std::uint8_t> b) {
  const auto u32 = [&](std::size_t at) {
    return static_cast<std::uint32_t>(b[at]) | static_cast<std::uint32_t>(b[at + 1]) << 8 |
           static_cast<std::uint32_t>(b[at + 2]) << 16 | static_cast<std::uint32_t>(b[at + 3]) << 24;
  };
  if (b.size() < 12 || std::memcmp(b.data(), "RIFF", 4) != 0 || std::memcmp(b.data() + 8, "WAVE", 4) != 0) return false;
  for (std::size_t at = 12; at + 8 <= b.size();) {
    const std::uint64_t size = u32(at + 4);
    if (std::memcmp(b.data() + at, "data", 4) == 0) {
      return size != 0 && size != 0xffffffffu && size > b.size() - (at + 8);
    }
    at += 8 + size + (size & 1);
  }
  return false;
}
sf_count_t mem_tell(void* user) { return static_cast<Memory*>(user)->at; }

}  // namespace

namespace {

// A file opened from memory; closed with the object.
class SoundFile {
 public:
  SoundFile(std::span<const std::uint8_t> bytes, std::string_view name) : who_(name), memory_{bytes} {
    if (bytes.empty()) throw SampleError(who_, "empty file (0 bytes)");
    file_ = sf_open_virtual(&io_, SFM_READ, &info_, &memory_);
    if (file_ == nullptr) throw SampleError(who_, fmt::format("not an audio file libsndfile reads: {}", sf_strerror(nullptr)));
    if (info_.channels <= 0 || info_.samplerate <= 0) {
      sf_close(file_);
      throw SampleError(who_, "no channels or no sample rate in its header");
    }
  }
  ~SoundFile() { sf_close(file_); }
  SoundFile(const SoundFile&) = delete;
  SoundFile& operator=(const SoundFile&) = delete;

  AudioHeader header() const {
    // info.frames is exact for every format but MP3 (an estimate) and is 0
    // when a stream does not say (FLAC written to a pipe).
    const bool exact = info_.frames > 0 && (info_.format & SF_FORMAT_SUBMASK) != SF_FORMAT_MPEG_LAYER_III;
    return {info_.samplerate, info_.channels, exact ? info_.frames : -1};
  }

  // Frames [first, last), last clipped to the end of the file.
  Audio read(sf_count_t first, sf_count_t last) {
    const AudioHeader h = header();
    if (h.frames >= 0) last = std::min<sf_count_t>(last, h.frames);
    if (first > 0 && sf_seek(file_, first, SEEK_SET) < 0) {
      throw SampleError(who_, fmt::format("cannot seek to frame {}: {}", first, sf_strerror(file_)));
    }
    Audio audio;
    audio.sample_rate = info_.samplerate;
    audio.channels = info_.channels;
    const auto channels = static_cast<std::size_t>(info_.channels);
    constexpr sf_count_t kChunk = 1 << 16;
    sf_count_t got = 0;
    while (got < last - first) {
      const sf_count_t want = std::min(kChunk, last - first - got);
      audio.samples.resize(static_cast<std::size_t>(got + want) * channels);
      const sf_count_t n = sf_readf_float(file_, audio.samples.data() + static_cast<std::size_t>(got) * channels, want);
      if (sf_error(file_) != SF_ERR_NO_ERROR) throw SampleError(who_, fmt::format("decoding failed: {}", sf_strerror(file_)));
      got += std::max<sf_count_t>(n, 0);
      if (n < want) break;
    }
    audio.samples.resize(static_cast<std::size_t>(got) * channels);
    if ((info_.format & SF_FORMAT_TYPEMASK) == SF_FORMAT_WAV && wav_data_cut(memory_.bytes)) {
      throw SampleError(who_, "truncated: its data chunk is longer than the file");
    }
    if (h.frames >= 0 && first + got < last) {
      throw SampleError(who_, fmt::format("truncated: its header promises {} frames, only {} decode", h.frames, first + got));
    }
    return audio;
  }

 private:
  std::string who_;
  Memory memory_;
  SF_VIRTUAL_IO io_{mem_length, mem_seek, mem_read, mem_write, mem_tell};
  SF_INFO info_{};
  SNDFILE* file_ = nullptr;
};

}  // namespace

AudioHeader read_audio_header(std::span<const std::uint8_t> bytes, std::string_view name) {
  return SoundFile(bytes, name).header();
}

Audio decode_audio_frames(std::span<const std::uint8_t> bytes, std::string_view name, std::int64_t first,
                          std::int64_t last) {
  Audio audio = SoundFile(bytes, name).read(first, last);
  if (audio.samples.empty()) throw SampleError(std::string(name), first > 0 ? "no audio in its time span" : "no audio samples");
  return audio;
}

Audio decode_audio(std::span<const std::uint8_t> bytes, std::string_view name, TimeSpan span) {
  SoundFile file(bytes, name);
  const int rate = file.header().sample_rate;
  const sf_count_t first = span.start > 0 ? static_cast<sf_count_t>(std::floor(span.start * rate)) : 0;
  const sf_count_t last = span.end >= 0 ? static_cast<sf_count_t>(std::ceil(span.end * rate))
                                        : std::numeric_limits<sf_count_t>::max();
  Audio audio = file.read(first, last);
  if (audio.samples.empty()) {
    throw SampleError(std::string(name), span.start > 0 || span.end >= 0 ? "no audio in its time span" : "no audio samples");
  }
  return audio;
}

std::vector<float> downmix(const Audio& audio) {
  const std::size_t frames = audio.frames();
  const auto channels = static_cast<std::size_t>(audio.channels);
  if (channels == 1) return audio.samples;
  std::vector<float> mono(frames);
  const float scale = 1.0f / static_cast<float>(channels);
  for (std::size_t f = 0; f < frames; ++f) {
    float sum = 0;
    for (std::size_t c = 0; c < channels; ++c) sum += audio.samples[f * channels + c];
    mono[f] = sum * scale;
  }
  return mono;
}

std::vector<float> resample(std::span<const float> mono, int from_rate, int to_rate) {
  if (from_rate == to_rate) return {mono.begin(), mono.end()};
  const auto out_len = static_cast<std::size_t>(
      std::ceil(static_cast<double>(mono.size()) * to_rate / static_cast<double>(from_rate)));
  std::vector<float> out(out_len);
  std::size_t done = 0;
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
  // Single-threaded: the worker pool already runs one sample per core.
  const soxr_runtime_spec_t runtime = soxr_runtime_spec(1);
  if (const soxr_error_t e = soxr_oneshot(from_rate, to_rate, 1, mono.data(), mono.size(), nullptr, out.data(),
                                          out.size(), &done, &io, &quality, &runtime)) {
    // A header with an absurd rate fails here: a fault of the sample, named by the caller.
    throw SampleError("", fmt::format("soxr: resampling {} Hz to {} Hz failed: {}", from_rate, to_rate, e));
  }
  out.resize(done);
  return out;
}

std::size_t crop_start(std::size_t length, std::size_t crop, AudioCrop how, SampleRng& rng) {
  if (length <= crop) return 0;
  switch (how) {
    case AudioCrop::kStart:
      return 0;
    case AudioCrop::kCenter:
      return (length - crop) / 2;
    case AudioCrop::kRandom:
      return static_cast<std::size_t>(rng.randint(0, static_cast<std::int64_t>(length - crop) + 1));
  }
  return 0;
}

}  // namespace dlop::media
