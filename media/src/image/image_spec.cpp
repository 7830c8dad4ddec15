// JSON <-> TransformSpec, driven by the op table (transform_ops.hpp): each op's
// params() is walked by a reader (JSON to fields), a checker (validate), a
// writer (to_json) and a describer (describe_ops). Every error names where in
// the spec it is.
#include "media/image_spec.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.hpp"

namespace dlop::media {
namespace {

using nlohmann::json;

[[noreturn]] void fail(std::string_view where, std::string_view what) {
  throw_error(Errc::kInvalidArgument, fmt::format("transform spec: {}: {}", where, what));
}

// Every op of the table, default-constructed: the parser starts from these.
template <std::size_t... I>
std::array<OpSpec, sizeof...(I)> all_ops(std::index_sequence<I...>) {
  return {OpSpec(std::in_place_index<I>)...};
}
const std::array<OpSpec, std::variant_size_v<OpSpec>>& op_table() {
  static const auto table = all_ops(std::make_index_sequence<std::variant_size_v<OpSpec>>{});
  return table;
}

// The rules each kind of parameter obeys, in one place for the reader and the
// checker: whether a value is allowed, and what is expected in words.
bool side_ok(long long v) { return v > 0 && v <= kMaxSide; }
bool range_ok(const std::array<double, 2>& r, Low low) {
  return r[0] <= r[1] && (low == Low::kPositive ? r[0] > 0 : r[0] >= 0);
}
std::string range_expected(Low low) {
  return low == Low::kPositive ? "[low, high] with 0 < low <= high" : "[low, high] with 0 <= low <= high";
}
std::string number_expected(double lo, double hi) { return fmt::format("a number in [{}, {}]", lo, hi); }
std::string integer_expected(int lo, int hi) { return fmt::format("an integer in [{}, {}]", lo, hi); }
std::string channels_expected(Zero zero) {
  return zero == Zero::kRefused ? "a list of 3 non-zero numbers (one per channel)" : "a list of 3 numbers (one per channel)";
}
constexpr const char* kSizeExpected = "a positive integer or [height, width]";

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
  const json& need(const char* key) {
    const json* v = get(key);
    if (v == nullptr) fail(where_, fmt::format("missing \"{}\"", key));
    return *v;
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

bool is_side(const json& v) { return v.is_number_integer() && side_ok(v.get<long long>()); }

// Reads an op's parameters from its JSON object (the reader of params()).
class Reader {
 public:
  explicit Reader(Fields& f) : f_(f) {}
  void size(const char* key, Size2& out, Need need) {
    const json* v = need == Need::kRequired ? &f_.need(key) : f_.get(key);
    if (v != nullptr) out = as_size(key, *v);
  }
  void size_or_side(const char* key, std::optional<Size2>& size, std::optional<int>& side) {
    const json& v = f_.need(key);
    if (is_side(v)) {
      side = v.get<int>();
    } else {
      size = as_size(key, v);
    }
  }
  void range(const char* key, std::array<double, 2>& out, Low low) {
    const json* v = f_.get(key);
    if (v == nullptr) return;
    if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number()) f_.bad(key, "[low, high]");
    out = {(*v)[0].get<double>(), (*v)[1].get<double>()};
    if (!range_ok(out, low)) f_.bad(key, range_expected(low));
  }
  void flag(const char* key, bool& out) {
    if (const json* v = f_.get(key)) {
      if (!v->is_boolean()) f_.bad(key, "true or false");
      out = v->get<bool>();
    }
  }
  void number(const char* key, double& out, double lo, double hi) {
    if (const json* v = f_.get(key)) {
      if (!v->is_number() || !(v->get<double>() >= lo && v->get<double>() <= hi)) f_.bad(key, number_expected(lo, hi));
      out = v->get<double>();
    }
  }
  void integer(const char* key, int& out, int lo, int hi) {
    if (const json* v = f_.get(key)) {
      if (!v->is_number_integer() || v->get<long long>() < lo || v->get<long long>() > hi) {
        f_.bad(key, integer_expected(lo, hi));
      }
      out = v->get<int>();
    }
  }
  void channels(const char* key, std::array<float, 3>& out, Zero zero) {
    const json& v = f_.need(key);
    if (!v.is_array() || v.size() != 3) f_.bad(key, channels_expected(zero));
    for (std::size_t i = 0; i < 3; ++i) {
      if (!v[i].is_number() || (zero == Zero::kRefused && v[i].get<double>() == 0.0)) f_.bad(key, channels_expected(zero));
      out[i] = static_cast<float>(v[i].get<double>());
    }
  }

 private:
  Size2 as_size(const char* key, const json& v) {
    if (is_side(v)) return {v.get<int>(), v.get<int>()};
    if (v.is_array() && v.size() == 2 && is_side(v[0]) && is_side(v[1])) return {v[0].get<int>(), v[1].get<int>()};
    f_.bad(key, kSizeExpected);
  }
  Fields& f_;
};

// Checks an op's parameters where they were set in C++ (the checker of params()).
class Checker {
 public:
  explicit Checker(const std::string& where) : where_(where) {}
  void size(const char* key, const Size2& s, Need) {
    if (!side_ok(s[0]) || !side_ok(s[1])) bad(key, kSizeExpected);
  }
  void size_or_side(const char* key, const std::optional<Size2>& size, const std::optional<int>& side) {
    if (size.has_value() == side.has_value()) fail(where_, "exactly one of size and shorter must be set");
    if (size) this->size(key, *size, Need::kRequired);
    if (side && !side_ok(*side)) bad(key, kSizeExpected);
  }
  void range(const char* key, const std::array<double, 2>& r, Low low) {
    if (!range_ok(r, low)) bad(key, range_expected(low));
  }
  void flag(const char*, bool) {}
  void number(const char* key, double v, double lo, double hi) {
    if (!(v >= lo && v <= hi)) bad(key, number_expected(lo, hi));
  }
  void integer(const char* key, int v, int lo, int hi) {
    if (v < lo || v > hi) bad(key, integer_expected(lo, hi));
  }
  void channels(const char* key, const std::array<float, 3>& c, Zero zero) {
    for (const float x : c) {
      if (!std::isfinite(x) || (zero == Zero::kRefused && x == 0.0f)) bad(key, channels_expected(zero));
    }
  }

 private:
  [[noreturn]] void bad(const char* key, std::string_view expected) const {
    fail(where_, fmt::format("\"{}\" must be {}", key, expected));
  }
  const std::string& where_;
};

json size_json(const Size2& s) { return json::array({s[0], s[1]}); }

// Writes an op's parameters as JSON (the writer of params()).
class Writer {
 public:
  explicit Writer(json& out) : out_(out) {}
  void size(const char* key, const Size2& s, Need) { out_[key] = size_json(s); }
  void size_or_side(const char* key, const std::optional<Size2>& size, const std::optional<int>& side) {
    out_[key] = side ? json(*side) : size_json(size.value_or(Size2{}));
  }
  void range(const char* key, const std::array<double, 2>& r, Low) { out_[key] = r; }
  void flag(const char* key, bool v) { out_[key] = v; }
  void number(const char* key, double v, double, double) { out_[key] = v; }
  void integer(const char* key, int v, int, int) { out_[key] = v; }
  void channels(const char* key, const std::array<float, 3>& c, Zero) { out_[key] = c; }

 private:
  json& out_;
};

// Describes an op's parameters for tools and Python (the describer of params()).
class Describer {
 public:
  void size(const char* key, const Size2& s, Need need) {
    add(key, "size", need == Need::kRequired ? json() : size_json(s), kSizeExpected);
  }
  void size_or_side(const char* key, const std::optional<Size2>&, const std::optional<int>&) {
    add(key, "size_or_side", json(), "a positive integer (the shorter side) or [height, width]");
  }
  void range(const char* key, const std::array<double, 2>& r, Low low) { add(key, "range", r, range_expected(low)); }
  void flag(const char* key, bool v) { add(key, "bool", v, "true or false"); }
  void number(const char* key, double v, double lo, double hi) { add(key, "number", v, number_expected(lo, hi)); }
  void integer(const char* key, int v, int lo, int hi) { add(key, "integer", v, integer_expected(lo, hi)); }
  void channels(const char* key, const std::array<float, 3>&, Zero zero) {
    add(key, "channels", json(), channels_expected(zero));
  }
  json params = json::array();

 private:
  // A null default means the parameter is required.
  void add(const char* key, const char* kind, json fallback, std::string_view expected) {
    json p{{"name", key}, {"kind", kind}, {"required", fallback.is_null()}, {"expected", expected}};
    if (!fallback.is_null()) p["default"] = std::move(fallback);
    params.push_back(std::move(p));
  }
};

std::string known_ops() {
  std::vector<std::string_view> names;
  for (const OpSpec& op : op_table()) names.push_back(op_name(op));
  return fmt::format("{}", fmt::join(names, ", "));
}

OpSpec parse_op(const json& j, std::size_t index) {
  if (!j.is_object() || !j.contains("op") || !j["op"].is_string()) {
    fail(fmt::format("ops[{}]", index), "each op must be an object with an \"op\" name");
  }
  const std::string name = j["op"].get<std::string>();
  Fields f(j, fmt::format("ops[{}] ({})", index, name));
  f.get("op");
  const auto& table = op_table();
  const auto it = std::find_if(table.begin(), table.end(), [&](const OpSpec& op) { return op_name(op) == name; });
  if (it == table.end()) fail(f.where(), fmt::format("unknown op (known: {})", known_ops()));
  OpSpec result = *it;
  std::visit(
      [&](auto& op) {
        Reader reader(f);
        op.params(op, reader);
      },
      result);
  f.finish();
  return result;
}

template <class E>
E read_choice(Fields& f, const char* key, E fallback, std::initializer_list<std::pair<const char*, E>> choices) {
  const json* v = f.get(key);
  if (v == nullptr) return fallback;
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) {
    if (*v == name) return value;
    names.push_back(fmt::format("\"{}\"", name));
  }
  f.bad(key, fmt::format("{}", fmt::join(names, " or ")));
}

}  // namespace

std::string_view op_name(const OpSpec& op) {
  return std::visit([](const auto& o) { return o.kName; }, op);
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
  spec.output = read_choice(f, "output", spec.output, {{"float32", OutputType::kFloat32}, {"uint8", OutputType::kUint8}});
  spec.on_error = read_choice(f, "on_error", spec.on_error, {{"raise", ErrorPolicy::kRaise}, {"skip", ErrorPolicy::kSkip}});
  if (const json* v = f.get("load_truncated_images")) {
    if (!v->is_boolean()) f.bad("load_truncated_images", "true or false");
    spec.load_truncated_images = v->get<bool>();
  }
  f.finish();
  spec.validate();
  return spec;
}

void TransformSpec::validate() const {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const std::string where = fmt::format("ops[{}] ({})", i, op_name(ops[i]));
    std::visit(
        [&](const auto& op) {
          using Op = std::remove_cvref_t<decltype(op)>;
          Checker checker(where);
          Op::params(op, checker);
          if constexpr (requires { op.check(); }) {
            if (const std::string problem = op.check(); !problem.empty()) fail(where, problem);
          }
          if constexpr (requires { Op::kLastAndFloat; }) {
            if (i + 1 != ops.size()) fail(where, fmt::format("{} must be the last op", Op::kName));
            if (output == OutputType::kUint8) {
              fail(where, fmt::format("{} makes float32 output; \"output\" is \"uint8\"", Op::kName));
            }
          }
        },
        ops[i]);
  }
}

std::string TransformSpec::to_json() const {
  json ops_json = json::array();
  for (const OpSpec& op : ops) {
    json o{{"op", std::string(op_name(op))}};
    Writer writer(o);
    std::visit([&](const auto& x) { x.params(x, writer); }, op);
    ops_json.push_back(std::move(o));
  }
  json j{{"ops", std::move(ops_json)},
         {"output", output == OutputType::kUint8 ? "uint8" : "float32"},
         {"on_error", on_error == ErrorPolicy::kSkip ? "skip" : "raise"}};
  if (load_truncated_images) j["load_truncated_images"] = true;
  return j.dump();
}

std::string describe_ops() {
  json out = json::array();
  for (const OpSpec& op : op_table()) {
    Describer d;
    std::visit([&](const auto& x) { x.params(x, d); }, op);
    out.push_back(json{{"op", std::string(op_name(op))}, {"params", std::move(d.params)}});
  }
  return out.dump();
}

}  // namespace dlop::media
