// The packed record file, version 2 (version 1 is read too). All integers
// little-endian.
//
//   offset 0            FileHeader (80 bytes)
//   meta_offset (80)    meta section, meta_size bytes:
//                         IndexEntry[num_records]   (40 bytes each)
//                         ClassEntry[num_classes]   (8 bytes each)
//                         version 2 only:
//                           u64 label_count, the size of the label pool
//                           RecordExtra[num_records] (24 bytes each)
//                           i64 labels[label_count] (the pool)
//                         string blob (record names, class names; UTF-8, no terminators)
//   data_offset         the records' bytes, back to back, data_size bytes: each
//                       its sidecar (sidecar_length bytes, version 2) then
//                       its file's bytes
//   file_size = data_offset + data_size
//
// Checksums (CRC-32, zlib's polynomial): header_crc covers the header's first
// 76 bytes, meta_crc the whole meta section, each index entry's crc its
// record's bytes. A reader checks the header and meta section when it opens
// the file and a record each time it reads it.
#pragma once

#include <bit>
#include <cstdint>

namespace dlop::media::record {

static_assert(std::endian::native == std::endian::little, "the record format is read in place: little-endian only");

inline constexpr char kMagic[8] = {'D', 'L', 'O', 'P', 'R', 'E', 'C', '\0'};
inline constexpr std::uint32_t kVersion = 2;

struct FileHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_size;  // sizeof(FileHeader)
  std::uint64_t file_size;
  std::uint64_t num_records;
  std::uint64_t num_classes;
  std::uint64_t meta_offset;
  std::uint64_t meta_size;
  std::uint64_t data_offset;
  std::uint64_t data_size;
  std::uint32_t meta_crc;
  std::uint32_t header_crc;  // of the bytes before it
};
static_assert(sizeof(FileHeader) == 80);

struct IndexEntry {
  std::uint64_t offset;  // from data_offset
  std::uint64_t length;
  std::int64_t label;  // in [0, num_classes); version 2: -1 for a record without labels
  std::uint32_t name_offset;  // in the string blob
  std::uint32_t name_length;
  std::uint32_t crc;  // of the record's bytes, sidecar included
  std::uint32_t sidecar_length;  // version 1: 0
};
static_assert(sizeof(IndexEntry) == 40);

// A record's labels (a slice of the pool; label is the first, or -1 when
// there are none) and time span.
struct RecordExtra {
  double start;
  double end;  // < 0: to the end
  std::uint32_t labels_at;
  std::uint32_t labels_count;
};
static_assert(sizeof(RecordExtra) == 24);

struct ClassEntry {
  std::uint32_t name_offset;
  std::uint32_t name_length;
};
static_assert(sizeof(ClassEntry) == 8);

// `crc`: the CRC-32 of the bytes before these, to checksum a record in parts.
std::uint32_t crc32(const void* data, std::uint64_t size, std::uint32_t crc = 0);

}  // namespace dlop::media::record
