// Scatter, linear: the root posts one send per rank, every other rank receives.
//
// Buffers: the root reads rank r's block at send + r * count (other ranks'
// send is never read and may be null); every rank receives recv[count].
// In place, at the root only: recv == send (MPI_IN_PLACE) or recv == the
// root's own block (send + root * count) both mean "the root's block stays
// where it is", and the root copies nothing. Tag: base_tag.
#include "rooted_blocks.hpp"

namespace dlop::coll {

Algorithm scatter_linear() {
  return rooted_algorithm(CollKind::kScatter, "linear", make_linear_blocks_task, BlockFlow::kFromRoot);
}

}  // namespace dlop::coll
