// Objects read where they live: an S3-compatible store (s3://bucket/key), an
// HTTP(S) server (http://..., https://...) or the local disk (any other
// string is a path), through one interface. Remote reads go through libcurl;
// S3 requests are signed with SigV4.
//
// Transient failures (HTTP 5xx or 429, a refused or reset connection, a
// timeout, a body cut short) are retried with exponential backoff for at most
// DLOP_STORE_RETRY_MS in all; permanent ones (403, 404, a bad signature, any
// other 4xx) fail at once. Either way the error is a dlop::Error naming the
// object's URL and the HTTP status (or curl's reason).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace dlop::media {

// Whether `location` names a remote object (s3://, http://, https://) rather
// than a local path.
bool is_remote(std::string_view location);

// One object, opened by location. Thread-safe: each call may come from any
// thread (remote reads reuse a connection per thread).
class ObjectReader {
 public:
  // A chunk of a streaming read; return false to stop the read there.
  using Chunk = std::function<bool(std::span<const std::uint8_t>)>;

  virtual ~ObjectReader() = default;
  // The object's URL (or path), as errors name it.
  virtual const std::string& location() const = 0;
  virtual std::uint64_t size() const = 0;
  // Exactly out.size() bytes from `offset`; an error when the object ends
  // before them.
  virtual void read(std::uint64_t offset, std::span<std::uint8_t> out) const = 0;
  // The bytes from `offset` to the end, in chunks as they arrive. A
  // transient failure mid-way resumes from the first byte not yet delivered,
  // so `chunk` sees every byte once, in order.
  virtual void stream(std::uint64_t offset, const Chunk& chunk) const = 0;
};

// Opens `location`; a missing object is an error here (its size is asked
// for at once).
std::unique_ptr<ObjectReader> open_object(const std::string& location);

// Writes the local file `file` as the object `location` (an S3 PUT, an HTTP
// PUT, or a copy for a local path).
void put_object(const std::string& location, const std::filesystem::path& file);

}  // namespace dlop::media
