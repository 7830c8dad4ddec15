// Registration of the rooted family: broadcast, reduce, gather, scatter.
// Each algorithm lives in its own file and returns its descriptor.
#include "collectives/registry.hpp"

namespace dlop::coll {

Algorithm broadcast_binomial();  // broadcast_binomial.cpp
Algorithm reduce_binomial();     // reduce_binomial.cpp
Algorithm gather_linear();       // gather_linear.cpp
Algorithm gather_binomial();     // gather_binomial.cpp
Algorithm scatter_linear();      // scatter_linear.cpp
Algorithm scatter_binomial();    // scatter_binomial.cpp

void register_rooted_family(std::vector<Algorithm>& out) {
  out.push_back(broadcast_binomial());
  out.push_back(reduce_binomial());
  out.push_back(gather_linear());
  out.push_back(gather_binomial());
  out.push_back(scatter_linear());
  out.push_back(scatter_binomial());
}

}  // namespace dlop::coll
