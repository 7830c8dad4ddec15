// The ring shared by allreduce, reduce_scatter(v) and allgather(v) "ring"
// (private to collectives/algorithms).
//
// n blocks (one per rank) travel around the ring: rank r sends to r + 1 and
// receives from r - 1. A reduce-scatter takes n - 1 steps: at step s rank r
// sends block r - 1 - s and receives block r - 2 - s, which it combines with
// its own contribution; after the last step it holds block r reduced over all
// ranks (each block is reduced by one chain of ranks, in one fixed order, so
// the result does not depend on timing). An all-gather takes n - 1 more
// steps: at step t rank r sends block r - t and receives block r - t - 1.
//
// Blocks are cut into chunks of about kRingChunkBytes; column k is chunk k of
// every block and runs all steps on its own (lane_pipeline.hpp), with up to
// kRingWindow columns in flight. Partial sums travel through two scratch
// chunks per lane (received, combined while hot in cache, forwarded), so a
// ring needs 2 * kRingWindow * kRingChunkBytes of scratch at most, whatever
// the message size; inputs are only read and outputs only written.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "collectives/task.hpp"
#include "collectives/types.hpp"

namespace dlop::coll {

inline constexpr std::size_t kRingChunkBytes = 256u << 10;
inline constexpr std::size_t kRingWindow = 4;

struct RingSpec {
  bool reduce_scatter = false;  // run the reduce-scatter steps (then `op` applies)
  bool all_gather = false;      // run the all-gather steps
  std::vector<std::size_t> counts;      // elements of block b
  // reduce-scatter: block b's input at send + in_offset[b]; all-gather alone:
  // send holds this rank's block only.
  std::vector<std::size_t> in_offset;
  // Where block b's result goes in recv; reduce-scatter alone writes only
  // this rank's block.
  std::vector<std::size_t> out_offset;
  const void* send = nullptr;
  void* recv = nullptr;
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
};

std::unique_ptr<Task> make_ring_task(const Group& group, transport::Tag base_tag, RingSpec spec);

}  // namespace dlop::coll
