// Locations to readers: remote URLs go to libcurl (http_object.cpp), any
// other string is a local file read with pread.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <vector>

#include "core/error.hpp"
#include "remote.hpp"

namespace dlop::media {
namespace {

class LocalObject final : public ObjectReader {
 public:
  explicit LocalObject(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw_errno(fmt::format("{}: cannot open", path_));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      ::close(fd_);
      throw_errno(fmt::format("{}: cannot stat", path_));
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  ~LocalObject() override { ::close(fd_); }
  LocalObject(const LocalObject&) = delete;
  LocalObject& operator=(const LocalObject&) = delete;

  const std::string& location() const override { return path_; }
  std::uint64_t size() const override { return size_; }

  void read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    if (offset > size_ || out.size() > size_ - offset) {
      throw_error(Errc::kInvalidArgument,
                  fmt::format("{}: bytes {}+{} are past its end ({} bytes)", path_, offset, out.size(), size_));
    }
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_errno(fmt::format("{}: read failed", path_));
      if (n == 0) throw_error(Errc::kSystem, fmt::format("{}: shrank while it was read", path_));
      done += static_cast<std::size_t>(n);
    }
  }

  void stream(std::uint64_t offset, const Chunk& chunk) const override {
    std::vector<std::uint8_t> buffer(1 << 20);
    while (offset < size_) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), size_ - offset));
      read(offset, {buffer.data(), n});
      offset += n;
      if (!chunk({buffer.data(), n})) return;
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace

bool is_remote(std::string_view location) {
  return location.starts_with("s3://") || location.starts_with("http://") || location.starts_with("https://");
}

std::unique_ptr<ObjectReader> open_object(const std::string& location) {
  if (is_remote(location)) return store::open_remote(location);
  return std::make_unique<LocalObject>(location);
}

void put_object(const std::string& location, const std::filesystem::path& file) {
  if (is_remote(location)) return store::put_remote(location, file);
  std::filesystem::copy_file(file, location, std::filesystem::copy_options::overwrite_existing);
}

}  // namespace dlop::media
