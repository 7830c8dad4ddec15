// Where samples come from: a folder tree by class (torchvision's ImageFolder
// layout, for images, videos or audio), a manifest of files with labels, or a
// packed record file written from either. Only the interface, open_source and
// the pack functions are public; the concrete sources are in
// media/src/source/concrete_sources.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dlop::media {

class ObjectReader;

// What a source's files are: it decides which file names a folder keeps.
enum class MediaKind { kImage, kVideo, kAudio };

// The part of a media file a sample is taken from, in seconds (a manifest's
// start and end columns); end < 0 means to the end of the file.
struct TimeSpan {
  double start = 0;
  double end = -1;
  bool operator==(const TimeSpan&) const = default;
};

// A read-only, indexed collection of encoded samples with integer labels.
// All methods are const and thread-safe.
class Source {
 public:
  virtual ~Source() = default;
  virtual std::size_t size() const = 0;
  virtual const std::vector<std::string>& classes() const = 0;
  virtual std::int64_t label(std::size_t i) const = 0;
  // For messages: the file's path, or the record's name in its file.
  virtual std::string name(std::size_t i) const = 0;
  // The encoded bytes of sample i, either in `scratch` or in memory the source
  // owns (valid while it lives). Throws SampleError when they cannot be read
  // (missing file, checksum mismatch) and dlop::Error for i >= size().
  virtual std::span<const std::uint8_t> read(std::size_t i, std::vector<std::uint8_t>& scratch) const = 0;

  // A multi-label source (a manifest with several labels on a line) lists
  // every class of a sample in labels(i); label(i) is then the first.
  virtual bool multi_label() const { return false; }
  virtual std::vector<std::int64_t> labels(std::size_t i) const { return {label(i)}; }
  virtual TimeSpan time_span(std::size_t /*i*/) const { return {}; }
  // What was computed from sample i's bytes when the source was packed (a
  // video's frame index), so readers need not compute it again; empty when
  // the source has none. Same storage rules as read().
  virtual std::span<const std::uint8_t> sidecar(std::size_t /*i*/, std::vector<std::uint8_t>& /*scratch*/) const {
    return {};
  }
  // Samples per shard, in index order, for a source made of shards (tar
  // shards): what EpochPlan's shard order needs. Empty for other sources.
  virtual std::vector<std::uint64_t> shard_sizes() const { return {}; }
  // Where sample i's bytes lie when read(i) returns exactly one byte range
  // of an object (BatchReads reads neighbours with one request).
  struct ByteRange {
    const ObjectReader* object = nullptr;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
  };
  virtual std::optional<ByteRange> byte_range(std::size_t /*i*/) const { return std::nullopt; }
};

// Opens tar shards (names_tar_shards) as TarShards, a folder as a
// FolderSource of `kind`, a .csv or .jsonl file as a Manifest, and any other
// file, or any s3:// or http(s):// URL, as a RecordFile.
std::unique_ptr<Source> open_source(const std::filesystem::path& path, MediaKind kind = MediaKind::kImage);

struct PackStats {
  std::size_t records = 0;
  std::size_t classes = 0;
  std::uint64_t bytes = 0;  // the whole file
};

// What `dlop pack` computes once per file and stores as its sidecar (a
// video's frame index); empty: nothing.
using MakeSidecar = std::function<std::vector<std::uint8_t>(std::span<const std::uint8_t> bytes, std::string_view name)>;

// `dlop pack`: writes every sample of `source` into one record file at `out`
// (written beside it, then renamed, so a crash never leaves a half-written
// file under that name). Records keep their bytes, labels, time span and
// name (a folder's relative path, a manifest's path), in the source's order.
// A file that cannot be read fails the pack.
PackStats pack_source(const Source& source, const std::filesystem::path& out, const MakeSidecar& sidecar = {});
// A folder of `kind` or a manifest (open_source's rules) into `out`; video
// records carry their frame index. An s3:// or http(s):// `out` is packed
// into a temporary file, then uploaded with one PUT.
PackStats pack_path(const std::filesystem::path& in, const std::filesystem::path& out, MediaKind kind);
PackStats pack_image_folder(const std::filesystem::path& root, const std::filesystem::path& out);

}  // namespace dlop::media
