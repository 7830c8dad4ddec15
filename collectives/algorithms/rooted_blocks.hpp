// Gather and scatter are one algorithm run in opposite directions (private to
// collectives/algorithms): the root's buffer holds one block per rank, in
// rank order, and every rank has its own block; gather moves the blocks to
// the root, scatter from it. Each direction's file documents its buffers.
//
// Seen from any one rank, every transfer is a send out of `send` (or of
// scratch) or a receive into `recv` (or into scratch), whichever the
// direction: the root's block array is recv for gather and send for scatter,
// a rank's own block the other way round. So both directions share one task
// per algorithm and no buffer loses its constness.
#pragma once

#include <memory>

#include "collectives/registry.hpp"

namespace dlop::coll {

enum class BlockFlow : bool { kToRoot, kFromRoot };  // gather, scatter

// "linear": the root exchanges a block with every other rank directly.
std::unique_ptr<Task> make_linear_blocks_task(const CollArgs& args, const Group& group, transport::Tag base_tag,
                                              BlockFlow flow);
// "binomial": blocks travel a binomial tree (binomial_tree.hpp), a subtree's
// blocks as one message; tags base_tag and base_tag + 1.
std::unique_ptr<Task> make_binomial_blocks_task(const CollArgs& args, const Group& group, transport::Tag base_tag,
                                                BlockFlow flow);

// The descriptor of a rooted algorithm that serves every valid root.
inline Algorithm rooted_algorithm(CollKind kind, std::string_view name,
                                  std::unique_ptr<Task> (*make)(const CollArgs&, const Group&, transport::Tag,
                                                                BlockFlow),
                                  BlockFlow flow) {
  return {
      .kind = kind,
      .name = name,
      .accepts = [](const CollArgs& args, const Group& group) { return args.root >= 0 && args.root < group.size(); },
      .create = [make, flow](const CollArgs& args, const Group& group, transport::Tag base_tag) {
        return make(args, group, base_tag, flow);
      },
  };
}

}  // namespace dlop::coll
