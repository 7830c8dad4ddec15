// Manifests: CSV with a header row, or JSON lines (source.hpp).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <set>

#include "core/error.hpp"
#include "media/image.hpp"
#include "concrete_sources.hpp"
#include "class_list.hpp"

namespace dlop::media {
namespace fs = std::filesystem;

namespace {

// One manifest line as read, labels still as written.
struct RawLine {
  std::string path;
  std::vector<std::string> labels;
  TimeSpan span;
};

[[noreturn]] void bad_line(const fs::path& file, std::size_t line, std::string_view why) {
  throw_error(Errc::kInvalidArgument, fmt::format("manifest {} line {}: {}", file.string(), line, why));
}

// RFC 4180 fields: commas separate, double quotes quote, "" is a quote.
std::vector<std::string> csv_fields(std::string_view line, const fs::path& file, std::size_t number) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  if (quoted) bad_line(file, number, "an unterminated quote");
  return fields;
}

double seconds_of(std::string_view text, const fs::path& file, std::size_t line, std::string_view column) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !(v >= 0)) {
    bad_line(file, line, fmt::format("{} {:?} is not a number of seconds >= 0", column, text));
  }
  return v;
}

std::vector<RawLine> read_csv(std::istream& in, const fs::path& file) {
  std::string text;
  std::vector<RawLine> out;
  std::map<std::string, std::size_t> column;
  std::size_t number = 0;
  while (std::getline(in, text)) {
    ++number;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.empty()) continue;
    const std::vector<std::string> f = csv_fields(text, file, number);
    if (column.empty()) {
      for (std::size_t i = 0; i < f.size(); ++i) column[f[i]] = i;
      if (!column.contains("path")) bad_line(file, number, "the header row has no \"path\" column");
      // A speech manifest may have transcripts instead of labels: the trainer
      // reads those from the manifest itself, so they never travel.
      if ((column.contains("label") && column.contains("labels")) ||
          (!column.contains("label") && !column.contains("labels") && !column.contains("transcript"))) {
        bad_line(file, number, "the header row needs one of the columns \"label\", \"labels\" and \"transcript\"");
      }
      continue;
    }
    if (f.size() != column.size()) {
      bad_line(file, number, fmt::format("{} fields, the header has {}", f.size(), column.size()));
    }
    RawLine line;
    line.path = f[column["path"]];
    if (auto it = column.find("label"); it != column.end()) {
      line.labels.push_back(f[it->second]);
    } else if (column.contains("labels")) {
      std::string_view rest = f[column["labels"]];
      while (!rest.empty()) {
        const std::size_t semi = rest.find(';');
        line.labels.emplace_back(rest.substr(0, semi));
        rest = semi == std::string_view::npos ? std::string_view{} : rest.substr(semi + 1);
      }
    }
    if (auto it = column.find("start"); it != column.end() && !f[it->second].empty()) {
      line.span.start = seconds_of(f[it->second], file, number, "start");
    }
    if (auto it = column.find("end"); it != column.end() && !f[it->second].empty()) {
      line.span.end = seconds_of(f[it->second], file, number, "end");
    }
    out.push_back(std::move(line));
  }
  return out;
}

std::string label_text(const nlohmann::json& v, const fs::path& file, std::size_t line) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<long long>());
  bad_line(file, line, fmt::format("label {} is neither a string nor an integer", v.dump()));
}

std::vector<RawLine> read_jsonl(std::istream& in, const fs::path& file) {
  std::string text;
  std::vector<RawLine> out;
  std::size_t number = 0;
  while (std::getline(in, text)) {
    ++number;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      bad_line(file, number, fmt::format("not JSON: {}", e.what()));
    }
    if (!j.is_object() || !j.contains("path") || !j["path"].is_string()) {
      bad_line(file, number, "expected an object with a string \"path\"");
    }
    RawLine line;
    line.path = j["path"].get<std::string>();
    if ((j.contains("label") && j.contains("labels")) ||
        (!j.contains("label") && !j.contains("labels") && !j.contains("transcript"))) {
      bad_line(file, number, "needs one of \"label\", \"labels\" and \"transcript\"");
    }
    if (j.contains("label")) {
      line.labels.push_back(label_text(j["label"], file, number));
    } else if (j.contains("labels")) {
      if (!j["labels"].is_array()) bad_line(file, number, "\"labels\" is not a list");
      for (const auto& v : j["labels"]) line.labels.push_back(label_text(v, file, number));
    }
    for (const char* key : {"start", "end"}) {
      if (!j.contains(key)) continue;
      if (!j[key].is_number() || !(j[key].get<double>() >= 0)) {
        bad_line(file, number, fmt::format("\"{}\" is not a number of seconds >= 0", key));
      }
      (key[0] == 's' ? line.span.start : line.span.end) = j[key].get<double>();
    }
    out.push_back(std::move(line));
  }
  return out;
}

}  // namespace

std::vector<std::string> class_list(const std::set<std::string>& names, std::map<std::string, std::int64_t>& class_of) {
  const auto is_integer = [](const std::string& s) {
    long long v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc() && end == s.data() + s.size() && v >= 0;
  };
  std::vector<std::string> classes;
  if (std::all_of(names.begin(), names.end(), is_integer)) {
    long long most = -1;
    for (const std::string& s : names) most = std::max(most, std::stoll(s));
    for (long long c = 0; c <= most; ++c) classes.push_back(std::to_string(c));
    for (const std::string& s : names) class_of[s] = std::stoll(s);
  } else {
    classes.assign(names.begin(), names.end());
    for (std::size_t c = 0; c < classes.size(); ++c) class_of[classes[c]] = static_cast<std::int64_t>(c);
  }
  return classes;
}

Manifest::Manifest(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw_errno(fmt::format("manifest {}: cannot open", path.string()));
  std::vector<RawLine> lines = path.extension() == ".jsonl" ? read_jsonl(in, path) : read_csv(in, path);
  if (lines.empty()) throw_error(Errc::kInvalidArgument, fmt::format("manifest {}: no samples", path.string()));

  std::set<std::string> names;
  for (const RawLine& l : lines) names.insert(l.labels.begin(), l.labels.end());
  std::map<std::string, std::int64_t> class_of;
  classes_ = class_list(names, class_of);
  const fs::path base = path.parent_path();
  for (std::size_t i = 0; i < lines.size(); ++i) {
    RawLine& l = lines[i];
    if (l.path.empty()) throw_error(Errc::kInvalidArgument, fmt::format("manifest {}: sample {} has no path", path.string(), i));
    if (l.span.end >= 0 && l.span.end <= l.span.start) {
      throw_error(Errc::kInvalidArgument, fmt::format("manifest {}: sample {} ends ({} s) before it starts ({} s)",
                                                      path.string(), i, l.span.end, l.span.start));
    }
    Entry e;
    e.path = fs::path(l.path).is_absolute() ? l.path : (base / l.path).string();
    for (const std::string& s : l.labels) e.labels.push_back(class_of.at(s));
    // Without any labels (transcripts only) each sample's label is -1.
    multi_label_ = multi_label_ || (!classes_.empty() && e.labels.size() != 1);
    e.span = l.span;
    entries_.push_back(std::move(e));
  }
}

const Manifest::Entry& Manifest::at(std::size_t i) const {
  if (i >= entries_.size()) throw_error(Errc::kInvalidArgument, fmt::format("Manifest: index {} out of range", i));
  return entries_[i];
}

std::int64_t Manifest::label(std::size_t i) const {
  const Entry& e = at(i);
  return e.labels.empty() ? -1 : e.labels.front();
}

std::vector<std::int64_t> Manifest::labels(std::size_t i) const { return at(i).labels; }
std::string Manifest::name(std::size_t i) const { return at(i).path; }
TimeSpan Manifest::time_span(std::size_t i) const { return at(i).span; }

std::span<const std::uint8_t> Manifest::read(std::size_t i, std::vector<std::uint8_t>& scratch) const {
  return read_file(at(i).path, scratch);
}

}  // namespace dlop::media
