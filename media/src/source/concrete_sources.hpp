// The concrete sources behind open_source (source.hpp): a folder by class, a
// manifest, a record file, tar shards, and a batch's reads ahead. Private to
// media/: callers outside it open sources by location.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "media/source.hpp"

namespace dlop::media {

// The file name extensions (lower case, with the dot) a folder of `kind`
// keeps.
const std::vector<std::string>& media_extensions(MediaKind kind);

// A batch's samples read ahead of making it, as a view of `source`: the
// samples with a byte range (Source::byte_range) are sorted by object and
// offset, and neighbours (gaps up to kMaxGap) are read with one request (a
// streamed GET for a remote object), then cut out of it. A sample alone in
// its run, past kMaxBytes read ahead, or of a source without ranges, is read
// by `source` when asked, as before.
// The bytes are those read() gives; everything else is `source`'s. A batch
// dealt from the shard-ordered plan thus costs one request, not one per
// sample.
class BatchReads final : public Source {
 public:
  // The bytes between two samples of one shard are their tar headers (512
  // bytes each, a pax or GNU long-name header a few more) and small members
  // such as .cls and .json: kilobytes. Reading a gap of up to 64 KiB costs
  // less than a request's round trip on any link whose bandwidth-delay
  // product exceeds that (1 ms at 0.5 Gbit/s), so such gaps are read through.
  static constexpr std::uint64_t kMaxGap = 64 << 10;
  // Bounds the memory a batch holds ahead (a batch of long videos would
  // otherwise hold them all at once).
  static constexpr std::uint64_t kMaxBytes = 64 << 20;

  BatchReads(const Source& source, std::span<const std::uint64_t> indices);
  std::size_t size() const override { return source_.size(); }
  const std::vector<std::string>& classes() const override { return source_.classes(); }
  std::int64_t label(std::size_t i) const override { return source_.label(i); }
  std::string name(std::size_t i) const override { return source_.name(i); }
  std::span<const std::uint8_t> read(std::size_t i, std::vector<std::uint8_t>& scratch) const override;
  bool multi_label() const override { return source_.multi_label(); }
  std::vector<std::int64_t> labels(std::size_t i) const override { return source_.labels(i); }
  TimeSpan time_span(std::size_t i) const override { return source_.time_span(i); }
  std::span<const std::uint8_t> sidecar(std::size_t i, std::vector<std::uint8_t>& scratch) const override {
    return source_.sidecar(i, scratch);
  }
  std::vector<std::uint64_t> shard_sizes() const override { return source_.shard_sizes(); }
  std::optional<ByteRange> byte_range(std::size_t i) const override { return source_.byte_range(i); }
  // GETs made ahead (for tests and stats).
  std::size_t requests() const { return requests_; }

 private:
  const Source& source_;
  std::vector<std::vector<std::uint8_t>> runs_;
  // Sample index -> (run, offset in it, size), sorted by index.
  struct Held {
    std::uint64_t index;
    std::size_t run;
    std::uint64_t offset, size;
  };
  std::vector<Held> held_;
  std::size_t requests_ = 0;
};

// torchvision's ImageFolder layout, for any media kind: classes are the
// sorted names of root's sub-folders, label = class index; each class's files
// are found recursively (following links) and sorted as torchvision sorts
// them (folders by path, then names), so indices equal torchvision's for the
// same tree. Only the kind's extensions (any case) are kept: .jpg, .jpeg and
// .png for images; .mp4, .mkv, .webm, .mov and .avi for video; .wav, .flac,
// .ogg, .opus and .mp3 for audio. A class with none is an error, as in
// torchvision. Files are read on demand.
class FolderSource : public Source {
 public:
  FolderSource(const std::filesystem::path& root, MediaKind kind);
  std::size_t size() const override { return files_.size(); }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::int64_t label(std::size_t i) const override;
  std::string name(std::size_t i) const override;
  std::span<const std::uint8_t> read(std::size_t i, std::vector<std::uint8_t>& scratch) const override;
  const std::filesystem::path& root() const { return root_; }
  // Path of sample i relative to root, with '/' separators.
  const std::string& relative_path(std::size_t i) const;

 private:
  struct Entry {
    std::string relative;
    std::int64_t label;
  };
  std::filesystem::path root_;
  std::vector<std::string> classes_;
  std::vector<Entry> files_;
};

class ImageFolder final : public FolderSource {
 public:
  explicit ImageFolder(const std::filesystem::path& root) : FolderSource(root, MediaKind::kImage) {}
};

// A manifest of files, one sample per line, paths relative to the manifest's
// folder (or absolute):
//   CSV with a header row naming its columns: path, then label (one class) or
//     labels (several, separated by ';') or transcript (text, read by the
//     trainer from the manifest: a sample without labels), and optional start
//     and end seconds;
//   JSON lines (.jsonl): {"path": ..., "label": ... | "labels": [...] |
//     "transcript": ..., "start": s, "end": s}.
// Labels are class names or integers. Classes are the sorted distinct names
// (integers: 0 .. the largest). A line with several labels makes the source
// multi-label. Malformed lines are errors naming the line.
class Manifest final : public Source {
 public:
  explicit Manifest(const std::filesystem::path& path);
  std::size_t size() const override { return entries_.size(); }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::int64_t label(std::size_t i) const override;
  std::string name(std::size_t i) const override;
  std::span<const std::uint8_t> read(std::size_t i, std::vector<std::uint8_t>& scratch) const override;
  bool multi_label() const override { return multi_label_; }
  std::vector<std::int64_t> labels(std::size_t i) const override;
  TimeSpan time_span(std::size_t i) const override;

 private:
  struct Entry {
    std::string path;
    std::vector<std::int64_t> labels;
    TimeSpan span;
  };
  const Entry& at(std::size_t i) const;
  std::vector<Entry> entries_;
  std::vector<std::string> classes_;
  bool multi_label_ = false;
};

// Reads a whole file into scratch; SampleError naming it when it cannot.
std::span<const std::uint8_t> read_file(const std::string& path, std::vector<std::uint8_t>& scratch);

// A packed record file (format in media/src/source/record_format.hpp),
// mapped read-only; or a remote one (an s3:// or http(s):// URL,
// object_store.hpp), whose header and index are read once and each record by
// a ranged read. Opening checks the header, the index checksum and every
// index entry's bounds, so a malformed file is a clear dlop::Error at open;
// each read checks the record's CRC-32 (a mismatch is a SampleError).
class RecordFile final : public Source {
 public:
  explicit RecordFile(const std::filesystem::path& path);
  ~RecordFile() override;
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;

  std::size_t size() const override;
  const std::vector<std::string>& classes() const override { return classes_; }
  std::int64_t label(std::size_t i) const override;
  std::string name(std::size_t i) const override;
  std::span<const std::uint8_t> read(std::size_t i, std::vector<std::uint8_t>& scratch) const override;
  std::span<const std::uint8_t> sidecar(std::size_t i, std::vector<std::uint8_t>& scratch) const override;
  bool multi_label() const override;
  std::vector<std::int64_t> labels(std::size_t i) const override;
  TimeSpan time_span(std::size_t i) const override;
  std::uint32_t version() const;

 private:
  // Record i's bytes, sidecar included, after its checksum is checked (in
  // scratch when the file is remote).
  std::span<const std::uint8_t> record(std::size_t i, std::vector<std::uint8_t>& scratch) const;
  void load_classes();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> classes_;
};

// WebDataset-style tar shards: each shard a tar file whose members are
// grouped into samples by key (a member's path up to the first '.' of its
// file name), consecutive members with one key making one sample. A
// sample's bytes are its first member with one of the kind's extensions
// (FolderSource's, without the dot: jpg, jpeg, png; mp4...; wav, flac...);
// its label is its .cls member: an integer, or a class name (classes follow
// Manifest's rule). Shards are local paths or s3:// / http(s):// URLs:
// `spec` is one shard, a folder of .tar files (sorted by name), or several
// specs joined by "::"; each may hold brace ranges and lists,
// "train-{000..015}.tar", "{a,b}.tar". Opening reads every shard's tar
// headers (only those: a member's bytes are skipped, by one ranged read per
// large member for a remote shard); a sample is then one ranged read, and
// neighbouring samples of a batch one streamed read (BatchReads).
// Malformed tar headers, and a sample without bytes of the kind or without a
// label, are errors naming the shard and the key.
class TarShards final : public Source {
 public:
  TarShards(const std::string& spec, MediaKind kind);
  ~TarShards() override;
  std::size_t size() const override { return samples_.size(); }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::int64_t label(std::size_t i) const override;
  std::string name(std::size_t i) const override;
  std::span<const std::uint8_t> read(std::size_t i, std::vector<std::uint8_t>& scratch) const override;
  std::vector<std::uint64_t> shard_sizes() const override;
  std::optional<ByteRange> byte_range(std::size_t i) const override;
  const std::vector<std::string>& shards() const { return locations_; }

 private:
  struct Sample {
    std::uint32_t shard;
    std::uint64_t offset;  // of the member's bytes in its shard
    std::uint64_t size;
    std::int64_t label;
    std::string member;  // its path in the tar
  };
  const Sample& at(std::size_t i) const;
  std::vector<std::string> locations_;
  std::vector<std::unique_ptr<ObjectReader>> shards_;
  std::vector<std::string> classes_;
  std::vector<Sample> samples_;
};

// The shards a TarShards spec names, in order (its brace and "::" rules; a
// local folder becomes its .tar files).
std::vector<std::string> expand_shards(const std::string& spec);
// Whether open_source reads `location` as tar shards: it ends in .tar, holds
// "::", or is a local folder holding .tar files.
bool names_tar_shards(const std::string& location);

}  // namespace dlop::media
