// Registration of the allreduce family: allreduce, reduce_scatter(v) and
// allgather(v). Each algorithm lives in its own file and returns its
// descriptor; ring.hpp is the engine the "ring" variants share.
#include "collectives/registry.hpp"

namespace dlop::coll {

Algorithm allreduce_ring();                // allreduce_ring.cpp
Algorithm allreduce_recursive_doubling();  // allreduce_recursive_doubling.cpp
Algorithm allreduce_rabenseifner();        // allreduce_rabenseifner.cpp
Algorithm allreduce_hierarchical();        // allreduce_hierarchical.cpp
Algorithm reduce_scatter_ring();           // reduce_scatter_ring.cpp
Algorithm reduce_scatterv_ring();          // reduce_scatter_ring.cpp
Algorithm allgather_ring();                // allgather_ring.cpp
Algorithm allgatherv_ring();               // allgather_ring.cpp
Algorithm allgather_bruck();               // allgather_bruck.cpp

void register_allreduce_family(std::vector<Algorithm>& out) {
  out.push_back(allreduce_ring());
  out.push_back(allreduce_recursive_doubling());
  out.push_back(allreduce_rabenseifner());
  out.push_back(allreduce_hierarchical());
  out.push_back(reduce_scatter_ring());
  out.push_back(reduce_scatterv_ring());
  out.push_back(allgather_ring());
  out.push_back(allgatherv_ring());
  out.push_back(allgather_bruck());
}

}  // namespace dlop::coll
