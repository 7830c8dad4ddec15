// WebDataset-style tar shards (source.hpp): the shard list, the tar headers
// (ustar, GNU long names, pax paths), and samples grouped by key.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "class_list.hpp"
#include "core/error.hpp"
#include "media/object_store.hpp"
#include "concrete_sources.hpp"

namespace dlop::media {
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kBlock = 512;
// Header reads fetch this much at once, so the headers of small members
// come with one request.
constexpr std::uint64_t kWindow = 1 << 20;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}


// Brace expansion: the first {a..b} (numbers, zero-padded to a's width) or
// {x,y,...} expanded, then the rest of the string, recursively.
void expand_braces(const std::string& s, std::vector<std::string>& out) {
  const auto open = s.find('{');
  if (open == std::string::npos) return out.push_back(s);
  const auto close = s.find('}', open);
  if (close == std::string::npos) throw_error(Errc::kInvalidArgument, fmt::format("shards {}: an unclosed '{{'", s));
  const std::string head = s.substr(0, open), body = s.substr(open + 1, close - open - 1), tail = s.substr(close + 1);
  std::vector<std::string> items;
  const auto dots = body.find("..");
  if (dots != std::string::npos) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    const auto number = [&](const std::string& t) {
      if (t.empty() || !std::all_of(t.begin(), t.end(), ::isdigit)) {
        throw_error(Errc::kInvalidArgument, fmt::format("shards {}: {{{}}} is not a range of numbers", s, body));
      }
      return std::stoull(t);
    };
    const auto from = number(a), to = number(b);
    if (to < from) throw_error(Errc::kInvalidArgument, fmt::format("shards {}: {{{}}} counts down", s, body));
    for (auto k = from; k <= to; ++k) items.push_back(fmt::format("{:0{}}", k, a.size()));
  } else {
    std::size_t start = 0;
    for (std::size_t comma; (comma = body.find(',', start)) != std::string::npos; start = comma + 1) {
      items.push_back(body.substr(start, comma - start));
    }
    items.push_back(body.substr(start));
  }
  for (const std::string& item : items) expand_braces(head + item + tail, out);
}

// Reads an object's bytes through a window of kWindow bytes.
class WindowReader {
 public:
  explicit WindowReader(const ObjectReader& object) : object_(object) {}
  std::span<const std::uint8_t> get(std::uint64_t offset, std::uint64_t n) {
    if (offset < start_ || offset + n > start_ + buffer_.size()) {
      buffer_.resize(static_cast<std::size_t>(std::min(std::max(n, kWindow), object_.size() - offset)));
      object_.read(offset, buffer_);
      start_ = offset;
    }
    return {buffer_.data() + (offset - start_), static_cast<std::size_t>(n)};
  }

 private:
  const ObjectReader& object_;
  std::uint64_t start_ = 0;
  std::vector<std::uint8_t> buffer_;
};

std::string field(std::span<const std::uint8_t> h, std::size_t at, std::size_t length) {
  const auto* p = reinterpret_cast<const char*>(h.data() + at);
  return std::string(p, strnlen(p, length));
}

// A numeric header field: octal text, or GNU's base-256 (high bit set).
std::uint64_t number(std::span<const std::uint8_t> h, std::size_t at, std::size_t length) {
  std::uint64_t v = 0;
  if (h[at] & 0x80) {
    for (std::size_t i = 1; i < length; ++i) v = (v << 8) | h[at + i];
    return v;
  }
  for (std::size_t i = 0; i < length && h[at + i] != 0 && h[at + i] != ' '; ++i) {
    if (h[at + i] < '0' || h[at + i] > '7') return ~std::uint64_t{0};
    v = v * 8 + (h[at + i] - '0');
  }
  return v;
}

// A pax header's path, or "".
std::string pax_path(std::string_view records) {
  while (!records.empty()) {
    const auto space = records.find(' ');
    std::size_t length = 0;
    if (space == std::string_view::npos || std::sscanf(std::string(records.substr(0, space)).c_str(), "%zu", &length) != 1 ||
        length <= space || length > records.size()) {
      return {};
    }
    const std::string_view record = records.substr(space + 1, length - space - 2);  // no trailing newline
    if (record.starts_with("path=")) return std::string(record.substr(5));
    records.remove_prefix(length);
  }
  return {};
}

struct Member {
  std::string path;
  std::uint64_t offset, size;
  std::string text;  // the bytes of a .cls member (read with the headers, through the same window)
};

bool is_label(const std::string& path) { return lower(path).ends_with(".cls"); }

// Every regular file of one tar, in order.
std::vector<Member> tar_members(const ObjectReader& shard) {
  WindowReader in(shard);
  std::vector<Member> out;
  const auto bad = [&](std::uint64_t at, std::string_view why) {
    throw_error(Errc::kInvalidArgument, fmt::format("shard {}: not a tar file: {} at byte {}", shard.location(), why, at));
  };
  std::string next_path;  // from a GNU long name or a pax header
  for (std::uint64_t at = 0; at + kBlock <= shard.size();) {
    const auto h = in.get(at, kBlock);
    if (std::all_of(h.begin(), h.end(), [](std::uint8_t b) { return b == 0; })) return out;  // the end blocks
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    if (number(h, 148, 8) != sum) bad(at, "header checksum mismatch");
    const std::uint64_t size = number(h, 124, 12);
    const std::uint64_t data = at + kBlock;
    if (size > shard.size() - data) bad(at, "a member runs past the end");
    const char type = static_cast<char>(h[156]);
    std::string path = field(h, 0, 100);
    if (field(h, 257, 5) == "ustar" && h[345] != 0) path = field(h, 345, 155) + "/" + path;
    if (!next_path.empty()) path = std::exchange(next_path, {});
    if (type == 'L' || type == 'x') {
      const auto bytes = in.get(data, size);
      const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      next_path = type == 'L' ? std::string(text.c_str()) : pax_path(text);
    } else if (type == '0' || type == '\0' || type == '7') {
      out.push_back({path, data, size, {}});
      if (is_label(path) && size <= 4096) {
        const auto bytes = in.get(data, size);
        out.back().text.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      }
    }
    at = data + (size + kBlock - 1) / kBlock * kBlock;
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_shards(const std::string& spec) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const auto sep = spec.find("::", start);
    std::vector<std::string> pieces;
    expand_braces(spec.substr(start, sep == std::string::npos ? std::string::npos : sep - start), pieces);
    for (const std::string& p : pieces) {
      std::error_code ec;
      if (!is_remote(p) && fs::is_directory(p, ec)) {
        std::vector<std::string> tars;
        for (const auto& e : fs::directory_iterator(p)) {
          if (e.path().extension() == ".tar") tars.push_back(e.path().string());
        }
        std::sort(tars.begin(), tars.end());
        out.insert(out.end(), tars.begin(), tars.end());
      } else if (!p.empty()) {
        out.push_back(p);
      }
    }
    if (sep == std::string::npos) break;
    start = sep + 2;
  }
  if (out.empty()) throw_error(Errc::kInvalidArgument, fmt::format("shards {}: no .tar files", spec));
  return out;
}

bool names_tar_shards(const std::string& location) {
  if (location.find("::") != std::string::npos || location.ends_with(".tar")) return true;
  std::error_code ec;
  if (is_remote(location) || !fs::is_directory(location, ec)) return false;
  for (const auto& e : fs::directory_iterator(location, ec)) {
    if (e.path().extension() == ".tar") return true;
  }
  return false;
}

TarShards::TarShards(const std::string& spec, MediaKind kind) : locations_(expand_shards(spec)) {
  std::set<std::string> wanted;  // without their dots: a key's extension follows its dot
  for (const std::string& e : media_extensions(kind)) wanted.insert(e.substr(1));
  std::vector<std::string> label_text;
  for (std::uint32_t s = 0; s < locations_.size(); ++s) {
    shards_.push_back(open_object(locations_[s]));
    const ObjectReader& shard = *shards_.back();
    const std::vector<Member> members = tar_members(shard);
    // One sample per run of members with one key.
    for (std::size_t m = 0; m < members.size();) {
      const auto key_of = [](const std::string& path) {
        const auto slash = path.rfind('/');
        const auto dot = path.find('.', slash == std::string::npos ? 0 : slash + 1);
        return dot == std::string::npos ? std::pair{path, std::string()} : std::pair{path.substr(0, dot), lower(path.substr(dot + 1))};
      };
      const std::string key = key_of(members[m].path).first;
      const Member* bytes = nullptr;
      std::optional<std::string> label;
      for (; m < members.size() && key_of(members[m].path).first == key; ++m) {
        const std::string ext = key_of(members[m].path).second;
        if (bytes == nullptr && wanted.contains(ext)) bytes = &members[m];
        if (ext == "cls" && !label) {
          std::string t = members[m].text;
          t.erase(0, t.find_first_not_of(" \t\r\n"));
          t.erase(t.find_last_not_of(" \t\r\n") + 1);
          label = t;
        }
      }
      const auto fail = [&](std::string_view why) {
        throw_error(Errc::kInvalidArgument, fmt::format("shard {}: sample {}: {}", shard.location(), key, why));
      };
      if (bytes == nullptr) fail(fmt::format("no member with one of the extensions {}", fmt::join(wanted, ", ")));
      if (!label || label->empty()) fail("no .cls member (its label: an integer or a name, at most 4096 bytes)");
      samples_.push_back({s, bytes->offset, bytes->size, 0, bytes->path});
      label_text.push_back(*label);
    }
  }
  if (samples_.empty()) throw_error(Errc::kInvalidArgument, fmt::format("shards {}: no samples", spec));
  std::map<std::string, std::int64_t> class_of;
  classes_ = class_list(std::set<std::string>(label_text.begin(), label_text.end()), class_of);
  for (std::size_t i = 0; i < samples_.size(); ++i) samples_[i].label = class_of.at(label_text[i]);
}

TarShards::~TarShards() = default;

const TarShards::Sample& TarShards::at(std::size_t i) const {
  if (i >= samples_.size()) throw_error(Errc::kInvalidArgument, fmt::format("tar shards: index {} out of range", i));
  return samples_[i];
}

std::int64_t TarShards::label(std::size_t i) const { return at(i).label; }

std::string TarShards::name(std::size_t i) const { return locations_[at(i).shard] + ":" + at(i).member; }

std::span<const std::uint8_t> TarShards::read(std::size_t i, std::vector<std::uint8_t>& scratch) const {
  const Sample& s = at(i);
  scratch.resize(static_cast<std::size_t>(s.size));
  shards_[s.shard]->read(s.offset, scratch);
  return {scratch.data(), scratch.size()};
}

std::vector<std::uint64_t> TarShards::shard_sizes() const {
  std::vector<std::uint64_t> sizes(locations_.size(), 0);
  for (const Sample& s : samples_) ++sizes[s.shard];
  return sizes;
}

std::optional<Source::ByteRange> TarShards::byte_range(std::size_t i) const {
  const Sample& s = at(i);
  return ByteRange{shards_[s.shard].get(), s.offset, s.size};
}

}  // namespace dlop::media
