// JSON <-> TransformSpec. Every error names where in the spec it is.
#include "offload/spec.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <set>

#include "core/error.hpp"

namespace dlop::offload {
namespace {

using nlohmann::json;

[[noreturn]] void fail(std::string_view where, std::string_view what) {
  throw_error(Errc::kInvalidArgument, fmt::format("transform spec: {}: {}", where, what));
}

// One JSON object being read: remembers which keys were used, so that
// leftovers (typos such as "sacle") are errors instead of silently ignored.
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j.is_object()) fail(where_, fmt::format("expected an object, got {}", j.dump()));
  }
  const json* get(const char* key) {
    used_.insert(key);
    const auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  [[noreturn]] void bad(const char* key, std::string_view expected) const {
    fail(where_, fmt::format("\"{}\" must be {}, got {}", key, expected, j_.at(key).dump()));
  }
  void finish() const {
    for (const auto& [key, value] : j_.items()) {
      if (!used_.contains(key)) fail(where_, fmt::format("unknown key \"{}\"", key));
    }
  }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
  std::set<std::string, std::less<>> used_;
};

void read_number(Fields& f, const char* key, double& out, double lo, double hi, std::string_view expected) {
  if (const json* v = f.get(key)) {
    if (!v->is_number() || v->get<double>() < lo || v->get<double>() > hi) f.bad(key, expected);
    out = v->get<double>();
  }
}

void read_bool(Fields& f, const char* key, bool& out) {
  if (const json* v = f.get(key)) {
    if (!v->is_boolean()) f.bad(key, "true or false");
    out = v->get<bool>();
  }
}

constexpr int kMaxSide = 1 << 15;

bool is_side(const json& v) { return v.is_number_integer() && v.get<long long>() > 0 && v.get<long long>() <= kMaxSide; }

// "size": 224 or [224, 192] ({height, width}).
Size2 read_size(Fields& f, const char* key, bool required, Size2 fallback) {
  const json* v = f.get(key);
  if (v == nullptr) {
    if (required) fail(f.where(), fmt::format("missing \"{}\"", key));
    return fallback;
  }
  if (is_side(*v)) return {v->get<int>(), v->get<int>()};
  if (v->is_array() && v->size() == 2 && is_side((*v)[0]) && is_side((*v)[1])) {
    return {(*v)[0].get<int>(), (*v)[1].get<int>()};
  }
  f.bad(key, "a positive integer or [height, width]");
}

std::array<double, 2> read_range(Fields& f, const char* key, std::array<double, 2> fallback, bool positive) {
  const json* v = f.get(key);
  if (v == nullptr) return fallback;
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number()) {
    f.bad(key, "[low, high]");
  }
  const std::array<double, 2> r{(*v)[0].get<double>(), (*v)[1].get<double>()};
  if (r[0] > r[1] || (positive && r[0] <= 0) || r[0] < 0) {
    f.bad(key, positive ? "[low, high] with 0 < low <= high" : "[low, high] with 0 <= low <= high");
  }
  return r;
}

std::array<float, 3> read_triple(Fields& f, const char* key, bool nonzero) {
  const json* v = f.get(key);
  if (v == nullptr) fail(f.where(), fmt::format("missing \"{}\"", key));
  std::array<float, 3> out{};
  if (!v->is_array() || v->size() != 3) f.bad(key, "a list of 3 numbers (one per channel)");
  for (std::size_t i = 0; i < 3; ++i) {
    if (!(*v)[i].is_number() || (nonzero && (*v)[i].get<double>() == 0.0)) {
      f.bad(key, nonzero ? "a list of 3 non-zero numbers" : "a list of 3 numbers");
    }
    out[i] = static_cast<float>((*v)[i].get<double>());
  }
  return out;
}

OpSpec parse_op(const json& j, std::size_t index) {
  if (!j.is_object() || !j.contains("op") || !j["op"].is_string()) {
    fail(fmt::format("ops[{}]", index), "each op must be an object with an \"op\" name");
  }
  const std::string name = j["op"].get<std::string>();
  Fields f(j, fmt::format("ops[{}] ({})", index, name));
  f.get("op");
  OpSpec result;
  if (name == "random_resized_crop") {
    RandomResizedCropOp op;
    op.size = read_size(f, "size", true, op.size);
    op.scale = read_range(f, "scale", op.scale, true);
    op.ratio = read_range(f, "ratio", op.ratio, true);
    read_bool(f, "antialias", op.antialias);
    result = op;
  } else if (name == "resize") {
    ResizeOp op;
    const json* size = f.get("size");
    if (size == nullptr) fail(f.where(), "missing \"size\"");
    if (is_side(*size)) {
      op.shorter = size->get<int>();
    } else {
      op.size = read_size(f, "size", true, {});
    }
    double max_size = 0;
    read_number(f, "max_size", max_size, 0, kMaxSide, "a positive integer");
    op.max_size = static_cast<int>(max_size);
    if (op.max_size != 0 && (!op.shorter || op.max_size <= *op.shorter)) {
      fail(f.where(), "\"max_size\" needs \"size\" as one integer smaller than it");
    }
    read_bool(f, "antialias", op.antialias);
    result = op;
  } else if (name == "center_crop") {
    CenterCropOp op;
    op.size = read_size(f, "size", true, op.size);
    result = op;
  } else if (name == "hflip") {
    HFlipOp op;
    read_number(f, "p", op.p, 0.0, 1.0, "a number in [0, 1]");
    result = op;
  } else if (name == "normalize") {
    NormalizeOp op;
    op.mean = read_triple(f, "mean", false);
    op.std = read_triple(f, "std", true);
    result = op;
  } else {
    fail(f.where(), "unknown op (known: random_resized_crop, resize, center_crop, hflip, normalize)");
  }
  f.finish();
  return result;
}

json size_json(const Size2& s) { return json::array({s[0], s[1]}); }

}  // namespace

std::string_view op_name(const OpSpec& op) {
  static constexpr std::string_view kNames[] = {"random_resized_crop", "resize", "center_crop", "hflip",
                                                "normalize"};
  return kNames[op.index()];
}

TransformSpec TransformSpec::from_json(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail("JSON", e.what());
  }
  Fields f(j, "top level");
  TransformSpec spec;
  const json* ops = f.get("ops");
  if (ops == nullptr || !ops->is_array()) fail("top level", "\"ops\" must be a list of ops");
  for (std::size_t i = 0; i < ops->size(); ++i) spec.ops.push_back(parse_op((*ops)[i], i));
  if (const json* v = f.get("output")) {
    if (*v == "float32") {
      spec.output = OutputType::kFloat32;
    } else if (*v == "uint8") {
      spec.output = OutputType::kUint8;
    } else {
      f.bad("output", "\"float32\" or \"uint8\"");
    }
  }
  if (const json* v = f.get("on_error")) {
    if (*v == "raise") {
      spec.on_error = ErrorPolicy::kRaise;
    } else if (*v == "skip") {
      spec.on_error = ErrorPolicy::kSkip;
    } else {
      f.bad("on_error", "\"raise\" or \"skip\"");
    }
  }
  f.finish();
  spec.validate();
  return spec;
}

void TransformSpec::validate() const {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const std::string where = fmt::format("ops[{}] ({})", i, op_name(ops[i]));
    if (std::holds_alternative<NormalizeOp>(ops[i])) {
      if (i + 1 != ops.size()) fail(where, "normalize must be the last op");
      if (output == OutputType::kUint8) fail(where, "normalize makes float32 output; \"output\" is \"uint8\"");
      for (const float s : std::get<NormalizeOp>(ops[i]).std) {
        if (s == 0.0f) fail(where, "\"std\" must not contain 0");
      }
    }
    if (const auto* r = std::get_if<ResizeOp>(&ops[i]); r != nullptr && r->size.has_value() == r->shorter.has_value()) {
      fail(where, "exactly one of size and shorter must be set");
    }
    if (const auto* p = std::get_if<HFlipOp>(&ops[i]); p != nullptr && !(p->p >= 0.0 && p->p <= 1.0)) {
      fail(where, "\"p\" must be a number in [0, 1]");
    }
    if (const auto* c = std::get_if<RandomResizedCropOp>(&ops[i]);
        c != nullptr && !(c->scale[0] > 0 && c->scale[0] <= c->scale[1] && c->ratio[0] > 0 && c->ratio[0] <= c->ratio[1])) {
      fail(where, "\"scale\" and \"ratio\" must be [low, high] with 0 < low <= high");
    }
  }
}

std::string TransformSpec::to_json() const {
  json ops_json = json::array();
  for (const OpSpec& op : ops) {
    json o{{"op", std::string(op_name(op))}};
    if (const auto* c = std::get_if<RandomResizedCropOp>(&op)) {
      o["size"] = size_json(c->size);
      o["scale"] = c->scale;
      o["ratio"] = c->ratio;
      o["antialias"] = c->antialias;
    } else if (const auto* r = std::get_if<ResizeOp>(&op)) {
      o["size"] = r->shorter ? json(*r->shorter) : size_json(*r->size);
      if (r->max_size) o["max_size"] = r->max_size;
      o["antialias"] = r->antialias;
    } else if (const auto* cc = std::get_if<CenterCropOp>(&op)) {
      o["size"] = size_json(cc->size);
    } else if (const auto* h = std::get_if<HFlipOp>(&op)) {
      o["p"] = h->p;
    } else if (const auto* n = std::get_if<NormalizeOp>(&op)) {
      o["mean"] = n->mean;
      o["std"] = n->std;
    }
    ops_json.push_back(std::move(o));
  }
  const json j{{"ops", std::move(ops_json)},
               {"output", output == OutputType::kUint8 ? "uint8" : "float32"},
               {"on_error", on_error == ErrorPolicy::kSkip ? "skip" : "raise"}};
  return j.dump();
}

}  // namespace dlop::offload
