// Allgather and allgather-v "ring": the second half of the ring allreduce
// (ring.hpp); at step t rank r forwards block r - t to r + 1. Bandwidth-
// optimal, n - 1 steps, pipelined in chunks; no scratch.
//
// Buffers: allgather send[count] -> recv[count * n], rank r's block at
// r * count; allgatherv send[counts[me]] -> recv[sum(counts)], blocks in rank
// order. In place (MPI_IN_PLACE): send == recv, or send == this rank's block
// of recv, means that block is already there. Accepts every case
// (allgatherv: one count per rank).
#include "blocks.hpp"
#include "collectives/registry.hpp"
#include "ring.hpp"

namespace dlop::coll {
namespace {

std::unique_ptr<Task> create(const CollArgs& args, const Group& group, transport::Tag base_tag,
                             const BlockLayout& layout) {
  return make_ring_task(group, base_tag,
                        {.reduce_scatter = false,
                         .all_gather = true,
                         .counts = layout.count,
                         .in_offset = {},
                         .out_offset = layout.offset,
                         .send = args.send,
                         .recv = args.recv,
                         .dtype = args.dtype,
                         .op = args.op});
}

}  // namespace

Algorithm allgather_ring() {
  return {
      .kind = CollKind::kAllgather,
      .name = "ring",
      .accepts = [](const CollArgs&, const Group&) { return true; },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) {
        return create(args, group, base_tag, BlockLayout::uniform(args.count, group.size()));
      },
  };
}

Algorithm allgatherv_ring() {
  return {
      .kind = CollKind::kAllgatherv,
      .name = "ring",
      .accepts = [](const CollArgs& args, const Group& group) {
        return args.counts.size() == static_cast<std::size_t>(group.size());
      },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) {
        return create(args, group, base_tag, BlockLayout::from_counts(args.counts));
      },
  };
}

}  // namespace dlop::coll
