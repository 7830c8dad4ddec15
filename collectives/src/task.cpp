#include "collectives/task.hpp"

#include <algorithm>

namespace dlop::coll {

bool RequestSet::test_all() {
  auto done = std::remove_if(requests_.begin(), requests_.end(), [](transport::Request& r) { return r.test(); });
  requests_.erase(done, requests_.end());
  return requests_.empty();
}

}  // namespace dlop::coll
