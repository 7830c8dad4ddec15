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
#include "ring_blocks.hpp"

namespace dlop::coll {

Algorithm reduce_scatter_ring() { return ring_half_algorithm(CollKind::kReduceScatter, RingHalf::kReduceScatter); }

Algorithm reduce_scatterv_ring() { return ring_half_algorithm(CollKind::kReduceScatterv, RingHalf::kReduceScatter); }

}  // namespace dlop::coll
