// A key/value store reachable by every process of a job: the out-of-band
// channel that wires the job up. Values are opaque bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlop::transport {

using Bytes = std::vector<std::uint8_t>;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits until the key exists; throws dlop::Error(kTimeout) naming the key.
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds delta to the integer stored at key (0 if absent); returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Removes the key; true if it existed.
  virtual bool erase(const std::string& key) = 0;
};

}  // namespace dlop::transport
