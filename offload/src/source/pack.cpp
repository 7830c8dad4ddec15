// `dlop pack`: an image folder into one record file (record_format.hpp).
// Names are known before any file is read, so the meta section's size, and
// with it where the records start, is fixed up front: the records stream out
// one file at a time, and the index and header are written last.
#include <unistd.h>

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.hpp"
#include "offload/source.hpp"
#include "record_format.hpp"

namespace dlop::offload {
namespace fs = std::filesystem;

PackStats pack_image_folder(const fs::path& root, const fs::path& out) {
  const ImageFolder folder(root);
  const std::size_t n = folder.size();
  const std::size_t num_classes = folder.classes().size();

  std::string strings;
  std::vector<record::IndexEntry> index(n);
  std::vector<record::ClassEntry> classes(num_classes);
  const auto add_string = [&](const std::string& s) {
    if (strings.size() + s.size() > std::numeric_limits<std::uint32_t>::max()) {
      throw_error(Errc::kInvalidArgument, "pack: more than 4 GiB of names");
    }
    const auto offset = static_cast<std::uint32_t>(strings.size());
    strings += s;
    return std::pair{offset, static_cast<std::uint32_t>(s.size())};
  };
  for (std::size_t c = 0; c < num_classes; ++c) {
    std::tie(classes[c].name_offset, classes[c].name_length) = add_string(folder.classes()[c]);
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::tie(index[i].name_offset, index[i].name_length) = add_string(folder.relative_path(i));
    index[i].label = folder.label(i);
  }

  record::FileHeader header{};
  std::memcpy(header.magic, record::kMagic, sizeof header.magic);
  header.version = record::kVersion;
  header.header_size = sizeof header;
  header.num_records = n;
  header.num_classes = num_classes;
  header.meta_offset = sizeof header;
  header.meta_size = n * sizeof(record::IndexEntry) + num_classes * sizeof(record::ClassEntry) + strings.size();
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
      // of the whole folder, not of whatever happened to be readable.
      const auto span = folder.read(i, bytes);
      file.write(reinterpret_cast<const char*>(span.data()), static_cast<std::streamsize>(span.size()));
      index[i].offset = offset;
      index[i].length = span.size();
      index[i].crc = record::crc32(span.data(), span.size());
      offset += span.size();
    }
    header.data_size = offset;
    header.file_size = header.data_offset + offset;

    std::string meta(header.meta_size, '\0');
    char* p = meta.data();
    std::memcpy(p, index.data(), n * sizeof(record::IndexEntry));
    p += n * sizeof(record::IndexEntry);
    std::memcpy(p, classes.data(), num_classes * sizeof(record::ClassEntry));
    p += num_classes * sizeof(record::ClassEntry);
    std::memcpy(p, strings.data(), strings.size());
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

}  // namespace dlop::offload
