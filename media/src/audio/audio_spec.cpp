// JSON <-> AudioSpec. Every key is read once through a table of (name, field,
// rule), so the reader, the checker and the writer cannot disagree, and a key
// no row reads (a typo) is an error.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <set>

#include "core/error.hpp"
#include "media/audio.hpp"

namespace dlop::media {
namespace {

using nlohmann::json;

[[noreturn]] void fail(std::string_view field, std::string_view what) {
  throw_error(Errc::kInvalidArgument, fmt::format("audio spec: {}: {}", field, what));
}

constexpr int kMaxRate = 384000;
constexpr int kMaxFft = 1 << 16;
constexpr int kMaxMels = 1024;
constexpr double kMaxSeconds = 3600;

template <typename E>
struct Names {
  std::vector<std::pair<E, const char*>> values;
  const char* name(E e) const {
    for (auto& [v, n] : values) if (v == e) return n;
    return "?";
  }
  std::string expected() const {
    std::string s;
    for (auto& [v, n] : values) s += fmt::format("{}\"{}\"", s.empty() ? "" : " or ", n);
    return s;
  }
};
const Names<AudioCrop> kCrops{{{AudioCrop::kRandom, "random"}, {AudioCrop::kStart, "start"}, {AudioCrop::kCenter, "center"}}};
const Names<MelScale> kScales{{{MelScale::kHtk, "htk"}, {MelScale::kSlaney, "slaney"}}};
const Names<ErrorPolicy> kPolicies{{{ErrorPolicy::kRaise, "raise"}, {ErrorPolicy::kSkip, "skip"}}};

// One row per key: how to read it from JSON, write it, and check it.
struct Row {
  const char* key;
  std::function<void(AudioSpec&, const json&)> read;
  std::function<json(const AudioSpec&)> write;
  std::function<void(const AudioSpec&)> check;
};

Row integer(const char* key, int AudioSpec::*field, int lo, int hi) {
  return {key,
          [=](AudioSpec& s, const json& v) {
            if (!v.is_number_integer()) fail(key, fmt::format("expected an integer in [{}, {}], got {}", lo, hi, v.dump()));
            const auto x = v.get<long long>();
            if (x < lo || x > hi) fail(key, fmt::format("expected an integer in [{}, {}], got {}", lo, hi, x));
            s.*field = static_cast<int>(x);
          },
          [=](const AudioSpec& s) { return json(s.*field); },
          [=](const AudioSpec& s) {
            if (s.*field < lo || s.*field > hi) fail(key, fmt::format("expected an integer in [{}, {}], got {}", lo, hi, s.*field));
          }};
}

Row number(const char* key, double AudioSpec::*field, double lo, double hi, bool open_low) {
  const auto ok = [=](double x) { return std::isfinite(x) && (open_low ? x > lo : x >= lo) && x <= hi; };
  const std::string expected = fmt::format("a number in {}{}, {}]", open_low ? "(" : "[", lo, hi);
  return {key,
          [=](AudioSpec& s, const json& v) {
            if (!v.is_number() || !ok(v.get<double>())) fail(key, fmt::format("expected {}, got {}", expected, v.dump()));
            s.*field = v.get<double>();
          },
          [=](const AudioSpec& s) { return json(s.*field); },
          [=](const AudioSpec& s) {
            if (!ok(s.*field)) fail(key, fmt::format("expected {}, got {}", expected, s.*field));
          }};
}

Row boolean(const char* key, bool AudioSpec::*field) {
  return {key,
          [=](AudioSpec& s, const json& v) {
            if (!v.is_boolean()) fail(key, fmt::format("expected true or false, got {}", v.dump()));
            s.*field = v.get<bool>();
          },
          [=](const AudioSpec& s) { return json(s.*field); }, [](const AudioSpec&) {}};
}

template <typename E>
Row choice(const char* key, E AudioSpec::*field, const Names<E>& names) {
  return {key,
          [=, &names](AudioSpec& s, const json& v) {
            for (auto& [e, n] : names.values) {
              if (v.is_string() && v.get<std::string>() == n) {
                s.*field = e;
                return;
              }
            }
            fail(key, fmt::format("expected {}, got {}", names.expected(), v.dump()));
          },
          [=, &names](const AudioSpec& s) { return json(names.name(s.*field)); }, [](const AudioSpec&) {}};
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = {
      integer("sample_rate", &AudioSpec::sample_rate, 1000, kMaxRate),
      number("seconds", &AudioSpec::seconds, 0, kMaxSeconds, /*open_low=*/true),
      choice("crop", &AudioSpec::crop, kCrops),
      integer("n_fft", &AudioSpec::n_fft, 2, kMaxFft),
      integer("win_length", &AudioSpec::win_length, 0, kMaxFft),
      integer("hop", &AudioSpec::hop, 1, kMaxFft),
      integer("n_mels", &AudioSpec::n_mels, 1, kMaxMels),
      number("f_min", &AudioSpec::f_min, 0, kMaxRate / 2.0, false),
      number("f_max", &AudioSpec::f_max, 0, kMaxRate / 2.0, false),
      choice("mel_scale", &AudioSpec::mel_scale, kScales),
      boolean("slaney_norm", &AudioSpec::slaney_norm),
      boolean("log", &AudioSpec::log),
      number("log_offset", &AudioSpec::log_offset, 0, 1, /*open_low=*/true),
      boolean("normalize", &AudioSpec::normalize),
      integer("freq_masks", &AudioSpec::freq_masks, 0, 64),
      integer("freq_mask_width", &AudioSpec::freq_mask_width, 0, kMaxMels),
      integer("time_masks", &AudioSpec::time_masks, 0, 64),
      integer("time_mask_width", &AudioSpec::time_mask_width, 0, 1 << 20),
      choice("on_error", &AudioSpec::on_error, kPolicies),
  };
  return table;
}

}  // namespace

AudioSpec AudioSpec::from_json(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw_error(Errc::kInvalidArgument, fmt::format("audio spec: not JSON: {}", e.what()));
  }
  if (!j.is_object()) fail("spec", fmt::format("expected an object, got {}", j.dump()));
  AudioSpec spec;
  std::set<std::string> used{"kind"};
  for (const Row& row : rows()) {
    if (auto it = j.find(row.key); it != j.end()) {
      row.read(spec, *it);
      used.insert(row.key);
    }
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!used.contains(it.key())) fail(it.key(), "unknown key");
  }
  if (!j.contains("seconds")) fail("seconds", "required: the crop length fixes the most frames a sample has");
  spec.validate();
  return spec;
}

std::string AudioSpec::to_json() const {
  json j = {{"kind", "audio"}};
  for (const Row& row : rows()) j[row.key] = row.write(*this);
  return j.dump();
}

void AudioSpec::validate() const {
  for (const Row& row : rows()) row.check(*this);
  if (win_length > n_fft) fail("win_length", fmt::format("{} is longer than n_fft {}", win_length, n_fft));
  const double nyquist = sample_rate / 2.0;
  const double top = f_max == 0 ? nyquist : f_max;
  if (top > nyquist) fail("f_max", fmt::format("{} Hz is above the Nyquist frequency {} Hz", f_max, nyquist));
  if (f_min >= top) fail("f_min", fmt::format("{} Hz is not below f_max {} Hz", f_min, top));
  if (freq_mask_width > n_mels) fail("freq_mask_width", fmt::format("{} is more than n_mels {}", freq_mask_width, n_mels));
  if (crop_samples() < 1) fail("seconds", "shorter than one sample at sample_rate");
}

int AudioSpec::crop_samples() const { return static_cast<int>(std::lround(seconds * sample_rate)); }

int AudioSpec::max_frames() const {
  // Centred frames: the signal is padded by n_fft / 2 on each side.
  return 1 + (crop_samples() + 2 * (n_fft / 2) - n_fft) / hop;
}

}  // namespace dlop::media
