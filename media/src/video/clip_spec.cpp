#include "clip_spec.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <set>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "media/transform_ops.hpp"

namespace dlop::media::detail {
namespace {

using nlohmann::json;

constexpr int kMaxFrames = 4096;
constexpr int kMaxStride = 1024;
constexpr int kMaxViews = 64;

[[noreturn]] void fail(std::string_view what) {
  throw_error(Errc::kInvalidArgument, fmt::format("transform spec (video): {}", what));
}

// The spec's object, key by key: what is read is marked, and leftovers
// (typos) are errors.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {
    if (!j.is_object()) fail(fmt::format("expected an object, got {}", j.dump()));
  }
  const json* get(const char* key) {
    used_.insert(key);
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void bad(const char* key, std::string_view expected) const {
    fail(fmt::format("\"{}\" must be {}, got {}", key, expected, j_.at(key).dump()));
  }
  void integer(const char* key, int& out, int lo, int hi) {
    if (const json* v = get(key)) {
      if (!v->is_number_integer() || v->get<long long>() < lo || v->get<long long>() > hi) {
        bad(key, fmt::format("an integer in [{}, {}]", lo, hi));
      }
      out = v->get<int>();
    }
  }
  void number(const char* key, double& out, double lo, double hi) {
    if (const json* v = get(key)) {
      if (!v->is_number() || !(v->get<double>() >= lo && v->get<double>() <= hi)) {
        bad(key, fmt::format("a number in [{}, {}]", lo, hi));
      }
      out = v->get<double>();
    }
  }
  void flag(const char* key, bool& out) {
    if (const json* v = get(key)) {
      if (!v->is_boolean()) bad(key, "true or false");
      out = v->get<bool>();
    }
  }
  // One side (both the same) or a pair of sides, each in [1, kMaxSide].
  std::optional<std::array<int, 2>> pair(const char* key, std::string_view expected) {
    const json* v = get(key);
    if (v == nullptr) return std::nullopt;
    const auto side = [](const json& x) {
      return x.is_number_integer() && x.get<long long>() > 0 && x.get<long long>() <= kMaxSide;
    };
    if (side(*v)) return std::array<int, 2>{v->get<int>(), v->get<int>()};
    if (v->is_array() && v->size() == 2 && side((*v)[0]) && side((*v)[1])) {
      return std::array<int, 2>{(*v)[0].get<int>(), (*v)[1].get<int>()};
    }
    bad(key, expected);
  }
  template <class E>
  void choice(const char* key, E& out, std::initializer_list<std::pair<const char*, E>> choices) {
    const json* v = get(key);
    if (v == nullptr) return;
    std::vector<std::string> names;
    for (const auto& [name, value] : choices) {
      if (*v == name) {
        out = value;
        return;
      }
      names.push_back(fmt::format("\"{}\"", name));
    }
    bad(key, fmt::format("{}", fmt::join(names, " or ")));
  }
  void finish() const {
    for (const auto& [key, value] : j_.items()) {
      if (!used_.contains(key)) fail(fmt::format("unknown key \"{}\"", key));
    }
  }

 private:
  const json& j_;
  std::set<std::string, std::less<>> used_;
};

std::array<float, 3> channels(const json& norm, const char* key, bool divisor) {
  const char* expected = divisor ? "a list of 3 non-zero numbers" : "a list of 3 numbers";
  const auto it = norm.find(key);
  if (it == norm.end()) fail(fmt::format("\"normalize\" needs \"{}\" ({})", key, expected));
  std::array<float, 3> out{};
  const bool ok = it->is_array() && it->size() == 3;
  for (std::size_t c = 0; ok && c < 3; ++c) {
    const json& x = (*it)[c];
    if (!x.is_number() || !std::isfinite(x.get<double>()) || (divisor && x.get<double>() == 0.0)) break;
    out[c] = static_cast<float>(x.get<double>());
    if (c == 2) return out;
  }
  fail(fmt::format("\"normalize\".\"{}\" must be {}, got {}", key, expected, it->dump()));
}

}  // namespace

ClipSpec ClipSpec::from_json(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(fmt::format("not JSON: {}", e.what()));
  }
  Fields f(j);
  if (const json* kind = f.get("kind"); kind != nullptr && *kind != "video") f.bad("kind", "\"video\"");
  ClipSpec s;
  f.integer("frames", s.frames, 1, kMaxFrames);
  f.integer("stride", s.stride, 1, kMaxStride);
  f.integer("views", s.views, 1, kMaxViews);
  f.choice("start", s.start, {{"random", ClipStart::kRandom}, {"uniform", ClipStart::kUniform}});
  f.integer("jitter", s.jitter, 0, kMaxStride);
  s.short_side = f.pair("short_side", "a positive integer or [min, max]");
  if (s.short_side && (*s.short_side)[0] > (*s.short_side)[1]) f.bad("short_side", "[min, max] with min <= max");
  const auto crop = f.pair("crop", "a positive integer or [height, width]");
  if (!crop) fail("missing \"crop\" (a positive integer or [height, width])");
  s.crop = *crop;
  f.choice("crop_position", s.crop_position, {{"random", CropPosition::kRandom}, {"center", CropPosition::kCenter}});
  f.number("hflip", s.hflip, 0.0, 1.0);
  f.flag("antialias", s.antialias);
  if (const json* norm = f.get("normalize")) {
    if (!norm->is_object()) f.bad("normalize", "{\"mean\": [3 numbers], \"std\": [3 numbers]}");
    for (const auto& [key, value] : norm->items()) {
      if (key != "mean" && key != "std") fail(fmt::format("unknown key \"normalize\".\"{}\"", key));
    }
    s.normalize = {{channels(*norm, "mean", false), channels(*norm, "std", true)}};
  }
  f.choice("layout", s.layout, {{"CTHW", ClipLayout::kCTHW}, {"TCHW", ClipLayout::kTCHW}});
  f.choice("output", s.output, {{"uint8", OutputType::kUint8}, {"float32", OutputType::kFloat32}});
  f.choice("on_error", s.on_error, {{"raise", ErrorPolicy::kRaise}, {"skip", ErrorPolicy::kSkip}});
  f.choice("short_clip", s.short_clip, {{"pad", ShortClip::kPad}, {"error", ShortClip::kError}});
  f.choice("rgb", s.rgb, {{"exact", RgbConversion::kExact}, {"fast", RgbConversion::kFast}});
  f.finish();
  if (s.short_side && std::max(s.crop[0], s.crop[1]) > (*s.short_side)[0]) {
    fail(fmt::format("\"crop\" [{}, {}] must fit in the smallest \"short_side\" {}", s.crop[0], s.crop[1],
                     (*s.short_side)[0]));
  }
  if (s.normalize && s.output == OutputType::kUint8) {
    fail("\"normalize\" makes float32 output; set \"output\": \"float32\"");
  }
  return s;
}

std::string ClipSpec::to_json() const {
  json j{{"kind", "video"},
         {"frames", frames},
         {"stride", stride},
         {"views", views},
         {"start", start == ClipStart::kRandom ? "random" : "uniform"},
         {"jitter", jitter},
         {"short_side", short_side ? json(*short_side) : json()},
         {"crop", crop},
         {"crop_position", crop_position == CropPosition::kRandom ? "random" : "center"},
         {"hflip", hflip},
         {"antialias", antialias},
         {"layout", layout == ClipLayout::kCTHW ? "CTHW" : "TCHW"},
         {"output", output == OutputType::kUint8 ? "uint8" : "float32"},
         {"on_error", on_error == ErrorPolicy::kRaise ? "raise" : "skip"},
         {"short_clip", short_clip == ShortClip::kPad ? "pad" : "error"},
         {"rgb", rgb == RgbConversion::kExact ? "exact" : "fast"}};
  if (normalize) j["normalize"] = {{"mean", (*normalize)[0]}, {"std", (*normalize)[1]}};
  return j.dump();
}

}  // namespace dlop::media::detail
