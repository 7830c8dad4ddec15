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

#include "offload/image.hpp"
#include "offload/source.hpp"
#include "record_format.hpp"

namespace dlop::offload {

std::uint32_t record::crc32(const void* data, std::uint64_t size) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
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
  const std::uint8_t* base = nullptr;
  std::size_t size = 0;
  record::FileHeader header{};
  const record::IndexEntry* index = nullptr;
  const char* strings = nullptr;
  std::uint64_t strings_size = 0;
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
  void check();
};

void RecordFile::Impl::check() {
  using record::FileHeader;
  if (size < sizeof(FileHeader)) malformed(fmt::format("{} bytes, shorter than the {}-byte header", size, sizeof(FileHeader)));
  std::memcpy(&header, base, sizeof header);
  if (std::memcmp(header.magic, record::kMagic, sizeof record::kMagic) != 0) malformed("not a dlop record file (bad magic)");
  if (header.version != record::kVersion) {
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
  if (record::crc32(base + header.meta_offset, header.meta_size) != header.meta_crc) malformed("index checksum mismatch");
  const std::uint8_t* meta = base + header.meta_offset;
  index = reinterpret_cast<const record::IndexEntry*>(meta);
  const auto* classes = reinterpret_cast<const record::ClassEntry*>(meta + header.num_records * sizeof(record::IndexEntry));
  strings = reinterpret_cast<const char*>(classes + header.num_classes);
  strings_size = header.meta_size - header.num_records * sizeof(record::IndexEntry) -
                 header.num_classes * sizeof(record::ClassEntry);
  data = base + header.data_offset;
  for (std::uint64_t c = 0; c < header.num_classes; ++c) {
    if (!string_ok(classes[c].name_offset, classes[c].name_length)) malformed(fmt::format("class {}: name out of bounds", c));
  }
  for (std::uint64_t i = 0; i < header.num_records; ++i) {
    const record::IndexEntry& e = index[i];
    if (e.offset > header.data_size || e.length > header.data_size - e.offset) {
      malformed(fmt::format("record {}: bytes out of bounds", i));
    }
    if (e.label < 0 || static_cast<std::uint64_t>(e.label) >= header.num_classes) {
      malformed(fmt::format("record {}: label {} not in [0, {})", i, e.label, header.num_classes));
    }
    if (!string_ok(e.name_offset, e.name_length)) malformed(fmt::format("record {}: name out of bounds", i));
  }
}

RecordFile::RecordFile(const std::filesystem::path& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path.string();
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
    impl_->check();
  } catch (...) {
    if (impl_->base != nullptr) ::munmap(const_cast<std::uint8_t*>(impl_->base), impl_->size);
    throw;
  }
  const auto* classes = reinterpret_cast<const record::ClassEntry*>(impl_->index + impl_->header.num_records);
  for (std::uint64_t c = 0; c < impl_->header.num_classes; ++c) {
    classes_.push_back(impl_->string_at(classes[c].name_offset, classes[c].name_length));
  }
}

RecordFile::~RecordFile() {
  if (impl_->base != nullptr) ::munmap(const_cast<std::uint8_t*>(impl_->base), impl_->size);
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

std::span<const std::uint8_t> RecordFile::read(std::size_t i, std::vector<std::uint8_t>& /*scratch*/) const {
  if (i >= size()) throw_error(Errc::kInvalidArgument, fmt::format("record file {}: index {} out of range", impl_->path, i));
  const record::IndexEntry& e = impl_->index[i];
  const std::uint8_t* p = impl_->data + e.offset;
  if (record::crc32(p, e.length) != e.crc) throw SampleError(name(i), "record checksum mismatch (corrupt record file)");
  return {p, static_cast<std::size_t>(e.length)};
}

}  // namespace dlop::offload
