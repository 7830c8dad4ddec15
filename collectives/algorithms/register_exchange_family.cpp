// Registration of the exchange family: alltoall, alltoallv, barrier.
// Each algorithm lives in its own file and returns its descriptor.
#include "collectives/registry.hpp"

namespace dlop::coll {

Algorithm alltoall_pairwise();      // alltoall_pairwise.cpp
Algorithm alltoallv_pairwise();     // alltoall_pairwise.cpp
Algorithm barrier_dissemination();  // barrier_dissemination.cpp

void register_exchange_family(std::vector<Algorithm>& out) {
  out.push_back(alltoall_pairwise());
  out.push_back(alltoallv_pairwise());
  out.push_back(barrier_dissemination());
}

}  // namespace dlop::coll
