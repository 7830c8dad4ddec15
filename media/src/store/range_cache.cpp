// The optional local cache of remote ranges (DLOP_STORE_CACHE_DIR,
// DLOP_STORE_CACHE_BYTES): each range read is a file named by a hash of
// (location, size, offset, length), evicted least recently used first once
// the files pass the limit. One process's cache, in a folder of its own
// (removed at exit): the index lives in memory, so a restarted daemon starts
// empty.
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <list>
#include <mutex>
#include <unordered_map>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "remote.hpp"

namespace dlop::media::store {
namespace fs = std::filesystem;
namespace {

class RangeCache {
 public:
  RangeCache(fs::path dir, std::uint64_t limit) : dir_(std::move(dir) / fmt::format("dlop-ranges-{}", ::getpid())), limit_(limit) {
    fs::create_directories(dir_);
  }
  ~RangeCache() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  RangeCache(const RangeCache&) = delete;
  RangeCache& operator=(const RangeCache&) = delete;

  // Fills `out` from the cache; false on a miss.
  bool get(const std::string& key, std::span<std::uint8_t> out) {
    {
      std::lock_guard lock(mu_);
      const auto it = index_.find(key);
      if (it == index_.end()) return false;
      lru_.splice(lru_.begin(), lru_, it->second);
    }
    // Read outside the lock: a file evicted meanwhile is a miss.
    std::ifstream in(path_of(key), std::ios::binary);
    return static_cast<bool>(in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size())));
  }

  void put(const std::string& key, std::span<const std::uint8_t> bytes) {
    if (bytes.size() > limit_) return;
    std::lock_guard lock(mu_);
    if (index_.contains(key)) return;
    const fs::path path = path_of(key);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) {  // a full disk costs the cache, never the read
      log().warn("store: cannot write the cache file {} (disk full?): not caching", path.string());
      std::error_code ec;
      fs::remove(path, ec);
      return;
    }
    lru_.push_front({key, bytes.size()});
    index_[key] = lru_.begin();
    used_ += bytes.size();
    while (used_ > limit_) {
      const Entry& last = lru_.back();
      std::error_code ec;
      fs::remove(path_of(last.key), ec);
      used_ -= last.bytes;
      index_.erase(last.key);
      lru_.pop_back();
    }
  }

 private:
  struct Entry {
    std::string key;
    std::uint64_t bytes;
  };
  fs::path path_of(const std::string& key) const { return dir_ / fmt::format("{:016x}", std::hash<std::string>{}(key)); }

  fs::path dir_;
  std::uint64_t limit_;
  std::mutex mu_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  std::uint64_t used_ = 0;
};

RangeCache* cache() {
  static std::unique_ptr<RangeCache> instance = [] {
    const Config& c = config();
    return c.store_cache_dir.empty() ? nullptr : std::make_unique<RangeCache>(c.store_cache_dir, c.store_cache_bytes);
  }();
  return instance.get();
}

// A remote object whose ranged reads go through the cache first; streaming
// reads pass through.
class CachedObject final : public ObjectReader {
 public:
  CachedObject(std::unique_ptr<ObjectReader> object, RangeCache& cache) : object_(std::move(object)), cache_(cache) {}
  const std::string& location() const override { return object_->location(); }
  std::uint64_t size() const override { return object_->size(); }
  void read(std::uint64_t offset, std::span<std::uint8_t> out) const override {
    const std::string key = fmt::format("{}\n{}\n{}\n{}", location(), size(), offset, out.size());
    if (cache_.get(key, out)) return;
    object_->read(offset, out);
    cache_.put(key, out);
  }
  void stream(std::uint64_t offset, const Chunk& chunk) const override { object_->stream(offset, chunk); }

 private:
  std::unique_ptr<ObjectReader> object_;
  RangeCache& cache_;
};

}  // namespace

std::unique_ptr<ObjectReader> with_cache(std::unique_ptr<ObjectReader> object) {
  RangeCache* c = cache();
  if (c == nullptr) return object;
  return std::make_unique<CachedObject>(std::move(object), *c);
}

}  // namespace dlop::media::store
