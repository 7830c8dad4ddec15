#include "c10d_store.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace dlop::backend {

void C10dStore::set(const std::string& key, const transport::Bytes& value) { store_->set(key, value); }

transport::Bytes C10dStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  try {
    // A zero timeout would be no limit at all to some c10d stores.
    store_->wait({key}, std::max(timeout, std::chrono::milliseconds(1)));
  } catch (const c10::Error& e) {
    // c10d reports a timeout as DistStoreError; the engine expects its own code
    // so that it can name the ranks that did not arrive.
    throw_error(Errc::kTimeout, fmt::format("store key '{}' not set within {} ms ({})", key, timeout.count(),
                                            e.what_without_backtrace()));
  }
  return store_->get(key);
}

std::int64_t C10dStore::add(const std::string& key, std::int64_t delta) { return store_->add(key, delta); }

bool C10dStore::erase(const std::string& key) { return store_->deleteKey(key); }

}  // namespace dlop::backend
