// Reading the packed record file (layout in record_format.hpp). Everything
// read from the file is checked before it is used as an offset or a size, so a
// damaged or hostile file is an error, never an out-of-bounds read.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <fmt/format.h>

#include <cstring>

#include "media/image.hpp"
#include "media/object_store.hpp"
#include "concrete_sources.hpp"
#include "record_format.hpp"

namespace dlop::media {

std::uint32_t record::crc32(const void* data, std::uint64_t size, std::uint32_t start) {
  uLong crc = start;
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {
    const uInt chunk = static_cast<uInt>(std::min<std::uint64_t>(size, 1u << 30));
    crc = ::crc32(crc, p, chunk);
    p += chunk;
    size -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

struct RecordFile::Impl {
  std::string path;
  // A local file is mapped whole (base, size); a remote one has its header
  // and meta section in `head` (base points there) and its records read by
  // ranges from `remote`.
  std::unique_ptr<ObjectReader> remote;
  std::vector<std::uint8_t> head;
  const std::uint8_t* base = nullptr;
  std::size_t size = 0;
  record::FileHeader header{};
  const record::IndexEntry* index = nullptr;
  const char* strings = nullptr;
  std::uint64_t strings_size = 0;
  const record::RecordExtra* extras = nullptr;  // version 2
  const std::int64_t* labels = nullptr;         // the pool
  bool multi_label = false;
  const std::uint8_t* data = nullptr;

  [[noreturn]] void malformed(std::string_view why) const {
    throw_error(Errc::kInvalidArgument, fmt::format("record file {}: malformed: {}", path, why));
  }
  std::string string_at(std::uint32_t offset, std::uint32_t length) const {
    return std::string(strings + offset, length);
  }
  bool string_ok(std::uint32_t offset, std::uint32_t length) const {
    return static_cast<std::uint64_t>(offset) + length <= strings_size;
  }
  void check_header();
  void check_meta();
  void open_remote();
};

void RecordFile::Impl::check_header() {
  using record::FileHeader;
  if (size < sizeof(FileHeader)) malformed(fmt::format("{} bytes, shorter than the {}-byte header", size, sizeof(FileHeader)));
  std::memcpy(&header, base, sizeof header);
  if (std::memcmp(header.magic, record::kMagic, sizeof record::kMagic) != 0) malformed("not a dlop record file (bad magic)");
  if (header.version != 1 && header.version != record::kVersion) {
    throw_error(Errc::kInvalidArgument, fmt::format("record file {}: version {} is not supported (this dlop reads version {})",
                                                    path, header.version, record::kVersion));
  }
  if (header.header_size != sizeof(FileHeader)) malformed("header size mismatch");
  if (record::crc32(base, offsetof(FileHeader, header_crc)) != header.header_crc) malformed("header checksum mismatch");
  if (header.file_size != size) {
    malformed(fmt::format("the header says {} bytes, the file has {} (truncated or appended to?)", header.file_size, size));
  }
  // Sections in order, inside the file; subtractions cannot wrap because each
  // bound is checked before it is used.
  if (header.meta_offset != sizeof(FileHeader) || header.meta_size > size - header.meta_offset ||
      header.data_offset != header.meta_offset + header.meta_size || header.data_size != size - header.data_offset) {
    malformed("section offsets do not add up");
  }
  if (header.num_records > header.meta_size / sizeof(record::IndexEntry) ||
      header.num_classes > (header.meta_size - header.num_records * sizeof(record::IndexEntry)) / sizeof(record::ClassEntry)) {
    malformed("index larger than its section");
  }
}

void RecordFile::Impl::check_meta() {
  if (record::crc32(base + header.meta_offset, header.meta_size) != header.meta_crc) malformed("index checksum mismatch");
  const std::uint8_t* meta = base + header.meta_offset;
  index = reinterpret_cast<const record::IndexEntry*>(meta);
  const auto* classes = reinterpret_cast<const record::ClassEntry*>(meta + header.num_records * sizeof(record::IndexEntry));
  const std::uint8_t* rest = reinterpret_cast<const std::uint8_t*>(classes + header.num_classes);
  std::uint64_t rest_size = header.meta_size - header.num_records * sizeof(record::IndexEntry) -
                            header.num_classes * sizeof(record::ClassEntry);
  std::uint64_t pool = 0;
  if (header.version >= 2) {
    if (rest_size < 8) malformed("no label pool size");
    std::memcpy(&pool, rest, 8);
    rest += 8;
    rest_size -= 8;
    if (header.num_records > rest_size / sizeof(record::RecordExtra) ||
        pool > (rest_size - header.num_records * sizeof(record::RecordExtra)) / 8) {
      malformed("labels larger than their section");
    }
    extras = reinterpret_cast<const record::RecordExtra*>(rest);
    labels = reinterpret_cast<const std::int64_t*>(rest + header.num_records * sizeof(record::RecordExtra));
    rest += header.num_records * sizeof(record::RecordExtra) + pool * 8;
    rest_size -= header.num_records * sizeof(record::RecordExtra) + pool * 8;
  }
  strings = reinterpret_cast<const char*>(rest);
  strings_size = rest_size;
  data = remote ? nullptr : base + header.data_offset;
  for (std::uint64_t c = 0; c < header.num_classes; ++c) {
    if (!string_ok(classes[c].name_offset, classes[c].name_length)) malformed(fmt::format("class {}: name out of bounds", c));
  }
  for (std::uint64_t i = 0; i < header.num_records; ++i) {
    const record::IndexEntry& e = index[i];
    if (e.offset > header.data_size || e.length > header.data_size - e.offset) {
      malformed(fmt::format("record {}: bytes out of bounds", i));
    }
    const bool unlabelled = extras != nullptr && extras[i].labels_count == 0 && e.label == -1;
    if (!unlabelled && (e.label < 0 || static_cast<std::uint64_t>(e.label) >= header.num_classes)) {
      malformed(fmt::format("record {}: label {} not in [0, {})", i, e.label, header.num_classes));
    }
    if (e.sidecar_length > e.length) malformed(fmt::format("record {}: sidecar longer than the record", i));
    if (extras != nullptr) {
      const record::RecordExtra& x = extras[i];
      if (x.labels_at > pool || x.labels_count > pool - x.labels_at) malformed(fmt::format("record {}: labels out of bounds", i));
      for (std::uint32_t k = 0; k < x.labels_count; ++k) {
        const std::int64_t c = labels[x.labels_at + k];
        if (c < 0 || static_cast<std::uint64_t>(c) >= header.num_classes) {
          malformed(fmt::format("record {}: label {} not in [0, {})", i, c, header.num_classes));
        }
      }
      if (x.labels_count > 0 && labels[x.labels_at] != e.label) malformed(fmt::format("record {}: labels disagree", i));
      if (!(x.start >= 0) || (x.end >= 0 && x.end <= x.start)) malformed(fmt::format("record {}: bad time span", i));
      multi_label = multi_label || x.labels_count != 1;
    } else if (e.sidecar_length != 0) {
      malformed(fmt::format("record {}: a sidecar in a version 1 file", i));
    }
    if (!string_ok(e.name_offset, e.name_length)) malformed(fmt::format("record {}: name out of bounds", i));
  }
}

// Two ranged reads: the header, then the meta section it locates.
void RecordFile::Impl::open_remote() {
  remote = open_object(path);
  size = static_cast<std::size_t>(remote->size());
  head.resize(std::min<std::size_t>(size, sizeof(record::FileHeader)));
  remote->read(0, head);
  base = head.data();
  check_header();
  head.resize(header.data_offset);
  remote->read(0, head);
  base = head.data();
  check_meta();
}

RecordFile::RecordFile(const std::filesystem::path& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path.string();
  if (is_remote(impl_->path)) {
    impl_->open_remote();
    load_classes();
    return;
  }
  const int fd = ::open(impl_->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno(fmt::format("record file {}: cannot open", impl_->path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw_errno(fmt::format("record file {}: cannot stat", impl_->path));
  }
  impl_->size = static_cast<std::size_t>(st.st_size);
  if (impl_->size > 0) {
    void* p = ::mmap(nullptr, impl_->size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw_errno(fmt::format("record file {}: cannot map", impl_->path));
    }
    impl_->base = static_cast<const std::uint8_t*>(p);
  }
  ::close(fd);
  try {
    impl_->check_header();
    impl_->check_meta();
  } catch (...) {
    if (impl_->base != nullptr) ::munmap(const_cast<std::uint8_t*>(impl_->base), impl_->size);
    throw;
  }
  load_classes();
}

void RecordFile::load_classes() {
  const auto* classes = reinterpret_cast<const record::ClassEntry*>(impl_->index + impl_->header.num_records);
  for (std::uint64_t c = 0; c < impl_->header.num_classes; ++c) {
    classes_.push_back(impl_->string_at(classes[c].name_offset, classes[c].name_length));
  }
}

RecordFile::~RecordFile() {
  if (impl_->base != nullptr && !impl_->remote) ::munmap(const_cast<std::uint8_t*>(impl_->base), impl_->size);
}

std::size_t RecordFile::size() const { return static_cast<std::size_t>(impl_->header.num_records); }
std::uint32_t RecordFile::version() const { return impl_->header.version; }

std::int64_t RecordFile::label(std::size_t i) const {
  if (i >= size()) throw_error(Errc::kInvalidArgument, fmt::format("record file {}: index {} out of range", impl_->path, i));
  return impl_->index[i].label;
}

std::string RecordFile::name(std::size_t i) const {
  if (i >= size()) throw_error(Errc::kInvalidArgument, fmt::format("record file {}: index {} out of range", impl_->path, i));
  return fmt::format("{}[{}] {}", impl_->path, i, impl_->string_at(impl_->index[i].name_offset, impl_->index[i].name_length));
}

std::span<const std::uint8_t> RecordFile::record(std::size_t i, std::vector<std::uint8_t>& scratch) const {
  if (i >= size()) throw_error(Errc::kInvalidArgument, fmt::format("record file {}: index {} out of range", impl_->path, i));
  const record::IndexEntry& e = impl_->index[i];
  const std::uint8_t* p = impl_->data + e.offset;
  if (impl_->remote) {
    scratch.resize(static_cast<std::size_t>(e.length));
    impl_->remote->read(impl_->header.data_offset + e.offset, scratch);
    p = scratch.data();
  }
  if (record::crc32(p, e.length) != e.crc) throw SampleError(name(i), "record checksum mismatch (corrupt record file)");
  return {p, static_cast<std::size_t>(e.length)};
}

std::span<const std::uint8_t> RecordFile::read(std::size_t i, std::vector<std::uint8_t>& scratch) const {
  return record(i, scratch).subspan(impl_->index[i].sidecar_length);
}

std::span<const std::uint8_t> RecordFile::sidecar(std::size_t i, std::vector<std::uint8_t>& scratch) const {
  return record(i, scratch).first(impl_->index[i].sidecar_length);
}

bool RecordFile::multi_label() const { return impl_->multi_label; }

std::vector<std::int64_t> RecordFile::labels(std::size_t i) const {
  if (impl_->extras == nullptr) return {label(i)};
  if (i >= size()) throw_error(Errc::kInvalidArgument, fmt::format("record file {}: index {} out of range", impl_->path, i));
  const record::RecordExtra& x = impl_->extras[i];
  return {impl_->labels + x.labels_at, impl_->labels + x.labels_at + x.labels_count};
}

TimeSpan RecordFile::time_span(std::size_t i) const {
  if (i >= size()) throw_error(Errc::kInvalidArgument, fmt::format("record file {}: index {} out of range", impl_->path, i));
  if (impl_->extras == nullptr) return {};
  return {impl_->extras[i].start, impl_->extras[i].end};
}

}  // namespace dlop::media
