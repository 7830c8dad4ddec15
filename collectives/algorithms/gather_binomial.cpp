// Gather along a binomial tree toward any root.
//
// Buffers and in place: as gather "linear" (every rank sends send[count]; the
// root receives rank r's block at recv + r * count; at the root, send == recv
// or send == recv + root * count means its block is already in place).
// A rank with children collects its subtree's blocks, in vrank order, in a
// scratch buffer (subtree size * count elements; a leaf sends straight from
// `send`) and sends them to its parent in one message. The root receives each
// child's subtree straight into recv: a subtree whose ranks wrap past rank
// n - 1 arrives as two messages, the part from rank 0 on tag base_tag + 1.
// log2(n) steps instead of n - 1 receives at the root, for the price of
// copies through intermediate ranks: for small blocks.
#include "rooted_blocks.hpp"

namespace dlop::coll {

Algorithm gather_binomial() {
  return rooted_algorithm(CollKind::kGather, "binomial", make_binomial_blocks_task, BlockFlow::kToRoot);
}

}  // namespace dlop::coll
