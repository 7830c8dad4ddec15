#include "transport/file_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.hpp"

namespace dlop::transport {
namespace {

std::optional<Bytes> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file_atomically(const std::string& path, const Bytes& value) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
    if (!out) throw_errno(fmt::format("file store: cannot write {}", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw_errno(fmt::format("file store: cannot rename to {}", path));
}

}  // namespace

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  if (ec) throw_error(Errc::kSystem, fmt::format("file store: cannot create {}: {}", directory_, ec.message()));
}

// Keys may contain '/'; flatten them so every key is one file in one directory.
std::string FileStore::path_of(const std::string& key) const {
  std::string name;
  for (const char c : key) {
    if (c == '/') name += "%2F";
    else if (c == '%') name += "%25";
    else name += c;
  }
  return directory_ + "/" + name;
}

void FileStore::set(const std::string& key, const Bytes& value) { write_file_atomically(path_of(key), value); }

Bytes FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(50);
  while (true) {
    if (auto value = read_file(path_of(key))) return *value;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw_error(Errc::kTimeout, fmt::format("file store {}: key '{}' not set within {} ms", directory_, key,
                                              timeout.count()));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10'000));
  }
}

std::int64_t FileStore::add(const std::string& key, std::int64_t delta) {
  // Serialise read-modify-write across processes with a lock file per key.
  const std::string lock_path = path_of(key) + ".lock";
  const int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw_errno(fmt::format("file store: cannot open {}", lock_path));
  ::flock(fd, LOCK_EX);
  std::int64_t value = 0;
  if (auto old = read_file(path_of(key))) value = std::stoll(std::string(old->begin(), old->end()));
  value += delta;
  const std::string text = std::to_string(value);
  write_file_atomically(path_of(key), Bytes(text.begin(), text.end()));
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return value;
}

bool FileStore::erase(const std::string& key) { return std::filesystem::remove(path_of(key)); }

}  // namespace dlop::transport
