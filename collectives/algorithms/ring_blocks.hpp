// The two halves of the ring allreduce (ring.hpp) as collectives of their own
// (private to collectives/algorithms): reduce-scatter and all-gather over one
// block per rank, equal blocks of args.count or, for the v-variants, one
// count per rank in args.counts (declined when there is not one per rank).
// Each half's file documents its buffers.
#pragma once

#include <utility>

#include "blocks.hpp"
#include "collectives/registry.hpp"
#include "ring.hpp"

namespace dlop::coll {

enum class RingHalf : bool { kReduceScatter, kAllGather };

inline Algorithm ring_half_algorithm(CollKind kind, RingHalf half) {
  const bool per_rank_counts = kind == CollKind::kAllgatherv || kind == CollKind::kReduceScatterv;
  return {
      .kind = kind,
      .name = "ring",
      .accepts = [per_rank_counts](const CollArgs& args, const Group& group) {
        return !per_rank_counts || args.counts.size() == static_cast<std::size_t>(group.size());
      },
      .create = [per_rank_counts, half](const CollArgs& args, const Group& group,
                                        transport::Tag base_tag) -> std::unique_ptr<Task> {
        const BlockLayout layout = per_rank_counts ? BlockLayout::from_counts(args.counts)
                                                   : BlockLayout::uniform(args.count, group.size());
        RingSpec spec{.counts = layout.count, .send = args.send, .recv = args.recv, .dtype = args.dtype, .op = args.op};
        if (half == RingHalf::kReduceScatter) {
          check_reduction(args.op, args.dtype);
          spec.reduce_scatter = true;
          spec.in_offset = layout.offset;
          spec.out_offset.assign(layout.count.size(), 0);  // only this rank's block is written, at recv
        } else {
          spec.all_gather = true;  // send holds this rank's block only
          spec.out_offset = layout.offset;
        }
        return make_ring_task(group, base_tag, std::move(spec));
      },
  };
}

}  // namespace dlop::coll
