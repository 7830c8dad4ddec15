// A Store kept in a directory of a shared file system: one file per key,
// written atomically by rename. Meant for tests and single-host jobs.
#pragma once

#include <string>

#include "transport/store.hpp"

namespace dlop::transport {

class FileStore : public Store {
 public:
  explicit FileStore(std::string directory);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bool erase(const std::string& key) override;

 private:
  std::string path_of(const std::string& key) const;

  std::string directory_;
};

}  // namespace dlop::transport
