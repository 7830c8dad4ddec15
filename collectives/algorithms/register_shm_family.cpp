// Registration of the intra-host algorithms that read or write peers' memory
// directly instead of sending messages.
#include "collectives/registry.hpp"

namespace dlop::coll {

void register_cma_allreduce(std::vector<Algorithm>& out);  // allreduce_cma.cpp
void register_shm_allreduce(std::vector<Algorithm>& out);  // allreduce_shm.cpp
void register_inline_allreduce(std::vector<Algorithm>& out);  // allreduce_inline.cpp

void register_shm_family(std::vector<Algorithm>& out) {
  register_cma_allreduce(out);
  register_shm_allreduce(out);
  register_inline_allreduce(out);
}

}  // namespace dlop::coll
