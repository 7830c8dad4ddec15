// Registration of the rooted family algorithms (filled in as they are written).
#include "collectives/registry.hpp"

namespace dlop::coll {

void register_rooted_family(std::vector<Algorithm>& /*out*/) {}

}  // namespace dlop::coll
