// Reduce-scatter and reduce-scatter-v "ring": the first half of the ring
// allreduce (ring.hpp); each rank ends with its own block reduced.
//
// Buffers: reduce_scatter send[count * n] -> recv[count], block r of send at
// r * count; reduce_scatterv send[sum(counts)] -> recv[counts[me]], blocks in
// rank order. In place: send == recv (MPI_IN_PLACE: the input is the whole
// buffer, the result lands at its start) or recv == this rank's block of send
// (the result replaces it). Either way each piece of the result is written
// only after the last read of the input it overwrites. AVG divides once, at
// the end. Accepts every case (reduce_scatterv: one count per rank).
#include "blocks.hpp"
#include "collectives/registry.hpp"
#include "ring.hpp"

namespace dlop::coll {
namespace {

std::unique_ptr<Task> create(const CollArgs& args, const Group& group, transport::Tag base_tag,
                             const BlockLayout& layout) {
  check_reduction(args.op, args.dtype);
  std::vector<std::size_t> out(layout.count.size(), 0);  // only this rank's block is written, at recv
  return make_ring_task(group, base_tag,
                        {.reduce_scatter = true,
                         .all_gather = false,
                         .counts = layout.count,
                         .in_offset = layout.offset,
                         .out_offset = std::move(out),
                         .send = args.send,
                         .recv = args.recv,
                         .dtype = args.dtype,
                         .op = args.op});
}

}  // namespace

Algorithm reduce_scatter_ring() {
  return {
      .kind = CollKind::kReduceScatter,
      .name = "ring",
      .accepts = [](const CollArgs&, const Group&) { return true; },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) {
        return create(args, group, base_tag, BlockLayout::uniform(args.count, group.size()));
      },
  };
}

Algorithm reduce_scatterv_ring() {
  return {
      .kind = CollKind::kReduceScatterv,
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
