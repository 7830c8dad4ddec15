// Allgather and allgather-v "ring": the second half of the ring allreduce
// (ring.hpp); at step t rank r forwards block r - t to r + 1. Bandwidth-
// optimal, n - 1 steps, pipelined in chunks; no scratch.
//
// Buffers: allgather send[count] -> recv[count * n], rank r's block at
// r * count; allgatherv send[counts[me]] -> recv[sum(counts)], blocks in rank
// order. In place (MPI_IN_PLACE): send == recv, or send == this rank's block
// of recv, means that block is already there. Accepts every case
// (allgatherv: one count per rank).
#include "ring_blocks.hpp"

namespace dlop::coll {

Algorithm allgather_ring() { return ring_half_algorithm(CollKind::kAllgather, RingHalf::kAllGather); }

Algorithm allgatherv_ring() { return ring_half_algorithm(CollKind::kAllgatherv, RingHalf::kAllGather); }

}  // namespace dlop::coll
