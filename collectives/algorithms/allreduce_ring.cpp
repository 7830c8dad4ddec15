// Allreduce "ring": a reduce-scatter, then an all-gather, around the ring
// (ring.hpp). Bandwidth-optimal: each rank sends and receives 2 (n - 1) / n of
// the vector; large vectors are pipelined in chunks with bounded scratch.
//
// Buffers: send[count] -> recv[count], send == recv in place. The vector is
// cut into n blocks whose sizes differ by at most one element (empty blocks
// when count < n). Block b is reduced by the chain b + 1, b + 2, ..., b and
// then copied to every rank, so all ranks hold bitwise the same result; AVG
// divides once, at the rank that completes the sum. Accepts every case.
#include "blocks.hpp"
#include "collectives/registry.hpp"
#include "ring.hpp"

namespace dlop::coll {

Algorithm allreduce_ring() {
  return {
      .kind = CollKind::kAllreduce,
      .name = "ring",
      .accepts = [](const CollArgs&, const Group&) { return true; },
      .create = [](const CollArgs& args, const Group& group, transport::Tag base_tag) -> std::unique_ptr<Task> {
        check_reduction(args.op, args.dtype);
        const BlockLayout layout = BlockLayout::even(args.count, group.size());
        return make_ring_task(group, base_tag,
                              {.reduce_scatter = true,
                               .all_gather = true,
                               .counts = layout.count,
                               .in_offset = layout.offset,
                               .out_offset = layout.offset,
                               .send = args.send,
                               .recv = args.recv,
                               .dtype = args.dtype,
                               .op = args.op});
      },
  };
}

}  // namespace dlop::coll
