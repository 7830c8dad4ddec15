// What one row of the collective benchmarks runs: the buffers and counts of a
// collective for a size S (nccl-tests' conventions), and the interface through
// which dlop and the MPI reference each run it.
#pragma once

#include <cstddef>
#include <string>

#include "collectives/coll_args.hpp"

namespace dlop::bench {

// One collective at one size, as nccl-tests defines it. S (bytes) is each
// rank's buffer, and for all-gather, reduce-scatter and all-to-all the full
// array (all ranks' blocks); algbw = S / time, busbw = algbw * busbw_factor.
struct CollLayout {
  coll::CollKind kind = coll::CollKind::kBarrier;
  std::size_t bytes = 0;      // S, after rounding the count down (as nccl-tests)
  std::size_t count = 0;      // the count argument of the call (MPI's convention)
  std::size_t in_elems = 0;   // elements each rank reads
  std::size_t out_elems = 0;  // elements each rank writes
  double busbw_factor = 0;
};

// The layout of `kind` for a requested size; count 0 when the size holds less
// than one element per rank (the row is skipped).
CollLayout make_layout(coll::CollKind kind, std::size_t bytes, coll::DataType dtype, int ranks);

bool reduces(coll::CollKind kind);
bool rooted(coll::CollKind kind);
// Broadcast has one buffer in dlop and MPI alike, barrier none: in place only.
bool has_out_of_place(coll::CollKind kind);

// The buffers of one call. In place, as both dlop and MPI_IN_PLACE read it:
//   allreduce, alltoall, reduce: send == recv
//   allgather      send == recv + rank * count (the rank's block, nccl-tests)
//   reducescatter  send == recv, holding count * n; the result lands at the start
//   broadcast      always send == recv
struct Call {
  coll::CollKind kind = coll::CollKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  coll::DataType dtype = coll::DataType::kFloat32;
  coll::ReduceOp op = coll::ReduceOp::kSum;
  int root = 0;
  bool in_place = false;
};

// One implementation of the collectives (dlop, or MPI's own). run() blocks
// until this rank's part is done and throws on failure.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual void run(const Call& call) = 0;
};

}  // namespace dlop::bench
