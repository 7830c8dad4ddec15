// Scatter along a binomial tree from any root.
//
// Buffers and in place: as scatter "linear" (the root reads rank r's block at
// send + r * count; every rank receives recv[count]; at the root, recv == send
// or recv == send + root * count means its block stays where it is).
// The root sends each child the blocks of the child's whole subtree, straight
// from `send` (as two messages when the subtree's ranks wrap past rank n - 1,
// the part from rank 0 on tag base_tag + 1). A rank with children receives
// its subtree's blocks into a scratch buffer (subtree size * count elements),
// keeps its own and forwards the rest, largest subtree first; a leaf
// receives straight into recv. For small blocks, as gather "binomial".
#include "rooted_blocks.hpp"

namespace dlop::coll {

Algorithm scatter_binomial() {
  return rooted_algorithm(CollKind::kScatter, "binomial", make_binomial_blocks_task, BlockFlow::kFromRoot);
}

}  // namespace dlop::coll
