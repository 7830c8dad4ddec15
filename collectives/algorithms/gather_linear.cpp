// Gather, linear: the root posts one receive per rank, every other rank sends.
//
// Buffers: every rank sends send[count]; the root receives rank r's block at
// recv + r * count (other ranks' recv is never touched and may be null).
// In place, at the root only: send == recv (MPI_IN_PLACE) or send == the
// root's own block (recv + root * count) both mean "the root's block is
// already where it belongs", and the root copies nothing. Tag: base_tag.
#include "rooted_blocks.hpp"

namespace dlop::coll {

Algorithm gather_linear() {
  return rooted_algorithm(CollKind::kGather, "linear", make_linear_blocks_task, BlockFlow::kToRoot);
}

}  // namespace dlop::coll
