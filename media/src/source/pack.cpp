// `dlop pack`: a source into one record file (record_format.hpp). Names and
// labels are known before any file is read, so the meta section's size, and
// with it where the records start, is fixed up front: the records stream out
// one file at a time, and the index and header are written last.
#include <unistd.h>

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.hpp"
#include "media/object_store.hpp"
#include "concrete_sources.hpp"
#include "media/video.hpp"
#include "record_format.hpp"

namespace dlop::media {
namespace fs = std::filesystem;

namespace {

// A record's name: a folder's path relative to its root (so the file moves
// with the data), else the source's name for it.
std::string record_name(const Source& source, std::size_t i) {
  if (const auto* folder = dynamic_cast<const FolderSource*>(&source)) return folder->relative_path(i);
  return source.name(i);
}

template <class T>
void append(std::string& meta, const T* items, std::size_t count) {
  meta.append(reinterpret_cast<const char*>(items), count * sizeof(T));
}

}  // namespace

PackStats pack_source(const Source& source, const fs::path& out, const MakeSidecar& make_sidecar) {
  const std::size_t n = source.size();
  const std::size_t num_classes = source.classes().size();

  std::string strings;
  std::vector<record::IndexEntry> index(n);
  std::vector<record::ClassEntry> classes(num_classes);
  std::vector<record::RecordExtra> extras(n);
  std::vector<std::int64_t> pool;
  const auto add_string = [&](const std::string& s) {
    if (strings.size() + s.size() > std::numeric_limits<std::uint32_t>::max()) {
      throw_error(Errc::kInvalidArgument, "pack: more than 4 GiB of names");
    }
    const auto offset = static_cast<std::uint32_t>(strings.size());
    strings += s;
    return std::pair{offset, static_cast<std::uint32_t>(s.size())};
  };
  for (std::size_t c = 0; c < num_classes; ++c) {
    std::tie(classes[c].name_offset, classes[c].name_length) = add_string(source.classes()[c]);
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::tie(index[i].name_offset, index[i].name_length) = add_string(record_name(source, i));
    const std::vector<std::int64_t> labels = source.labels(i);
    if (pool.size() + labels.size() > std::numeric_limits<std::uint32_t>::max()) {
      throw_error(Errc::kInvalidArgument, "pack: more than 2^32 labels");
    }
    index[i].label = labels.empty() ? -1 : labels.front();
    const TimeSpan span = source.time_span(i);
    extras[i] = {span.start, span.end, static_cast<std::uint32_t>(pool.size()), static_cast<std::uint32_t>(labels.size())};
    pool.insert(pool.end(), labels.begin(), labels.end());
  }

  record::FileHeader header{};
  std::memcpy(header.magic, record::kMagic, sizeof header.magic);
  header.version = record::kVersion;
  header.header_size = sizeof header;
  header.num_records = n;
  header.num_classes = num_classes;
  header.meta_offset = sizeof header;
  header.meta_size = n * sizeof(record::IndexEntry) + num_classes * sizeof(record::ClassEntry) + 8 +
                     n * sizeof(record::RecordExtra) + pool.size() * 8 + strings.size();
  header.data_offset = header.meta_offset + header.meta_size;

  const fs::path tmp = out.string() + fmt::format(".tmp.{}", ::getpid());
  std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
  if (!file) throw_errno(fmt::format("pack: cannot create {}", tmp.string()));
  try {
    file.seekp(static_cast<std::streamoff>(header.data_offset));
    std::vector<std::uint8_t> bytes;
    std::uint64_t offset = 0;
    for (std::size_t i = 0; i < n; ++i) {
      // A file that cannot be read fails the pack: a record file is a snapshot
      // of the whole source, not of whatever happened to be readable.
      const auto span = source.read(i, bytes);
      const std::vector<std::uint8_t> sidecar = make_sidecar ? make_sidecar(span, source.name(i)) : std::vector<std::uint8_t>{};
      if (sidecar.size() > std::numeric_limits<std::uint32_t>::max()) throw_error(Errc::kInvalidArgument, "pack: sidecar over 4 GiB");
      file.write(reinterpret_cast<const char*>(sidecar.data()), static_cast<std::streamsize>(sidecar.size()));
      file.write(reinterpret_cast<const char*>(span.data()), static_cast<std::streamsize>(span.size()));
      index[i].offset = offset;
      index[i].length = sidecar.size() + span.size();
      index[i].sidecar_length = static_cast<std::uint32_t>(sidecar.size());
      index[i].crc = record::crc32(span.data(), span.size(), record::crc32(sidecar.data(), sidecar.size()));
      offset += index[i].length;
    }
    header.data_size = offset;
    header.file_size = header.data_offset + offset;

    std::string meta;
    meta.reserve(header.meta_size);
    append(meta, index.data(), n);
    append(meta, classes.data(), num_classes);
    const std::uint64_t pool_count = pool.size();
    append(meta, &pool_count, 1);
    append(meta, extras.data(), n);
    append(meta, pool.data(), pool.size());
    meta += strings;
    header.meta_crc = record::crc32(meta.data(), meta.size());
    header.header_crc = record::crc32(&header, offsetof(record::FileHeader, header_crc));

    file.seekp(0);
    file.write(reinterpret_cast<const char*>(&header), sizeof header);
    file.write(meta.data(), static_cast<std::streamsize>(meta.size()));
    file.flush();
    if (!file) throw_error(Errc::kSystem, fmt::format("pack: writing {} failed (disk full?)", tmp.string()));
    file.close();
    fs::rename(tmp, out);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  return PackStats{n, num_classes, header.file_size};
}

PackStats pack_path(const fs::path& in, const fs::path& out, MediaKind kind) {
  std::error_code ec;
  const std::string ext = in.extension().string();
  if (!fs::is_directory(in, ec) && ext != ".csv" && ext != ".jsonl") {
    throw_error(Errc::kInvalidArgument,
                fmt::format("pack: {} is not a folder (one sub-folder per class) or a .csv/.jsonl manifest", in.string()));
  }
  const std::unique_ptr<Source> source = open_source(in, kind);
  MakeSidecar sidecar;
  if (kind == MediaKind::kVideo) {
    sidecar = [](std::span<const std::uint8_t> bytes, std::string_view name) {
      return scan_frame_index(bytes, name).serialize();
    };
  }
  if (!is_remote(out.string())) return pack_source(*source, out, sidecar);
  // To a store: packed into a local file first (the index is written last,
  // so the file cannot stream out as it is made), then one PUT.
  const fs::path local = fs::temp_directory_path() / fmt::format("dlop-pack-{}.dlop", ::getpid());
  try {
    const PackStats stats = pack_source(*source, local, sidecar);
    put_object(out.string(), local);
    fs::remove(local);
    return stats;
  } catch (...) {
    fs::remove(local, ec);
    throw;
  }
}

PackStats pack_image_folder(const fs::path& root, const fs::path& out) { return pack_source(ImageFolder(root), out); }

}  // namespace dlop::media
