// The engine's wire-up store over the c10d Store torch hands to a backend
// (TCPStore, FileStore or HashStore, behind the group's PrefixStore).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "transport/store.hpp"

namespace dlop::backend {

class C10dStore : public transport::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const transport::Bytes& value) override;
  transport::Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bool erase(const std::string& key) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace dlop::backend
