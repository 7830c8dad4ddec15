// dlop-bench allreduce | allgather | reducescatter | broadcast | reduce |
// alltoall | barrier: nccl-tests' tables for dlop's Communicator, with the MPI
// library's own collective measured in the same run on the same buffers
// when started by mpirun.
//
// Per size and placement (out-of-place, in-place): warm-up, then
// `repetitions` repetitions of `iterations` timed calls, dlop and MPI
// alternating repetition by repetition; each repetition's time per call is
// the slowest rank's, and the row shows the median repetition. Buffers
// rotate through a 64 MiB arena for sizes up to `rotate_bytes`, so that a
// small size is not served from the cache. Then one checked call each (#wrong).
#pragma once

#include <cstddef>
#include <string>

#include "collectives/coll_args.hpp"
#include "transport/bootstrap.hpp"

namespace dlop::bench {

struct CollectiveOptions {
  coll::CollKind kind = coll::CollKind::kAllreduce;
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{256} << 20;
  std::size_t factor = 4;
  coll::DataType dtype = coll::DataType::kFloat32;
  coll::ReduceOp op = coll::ReduceOp::kSum;
  int root = 0;
  int warmup = -1;         // calls before the repetitions; -1: auto (collective_bench.cpp)
  int iterations = 0;      // timed calls per repetition; 0: 32 MiB / S, within [3, 1000]
  int repetitions = 5;     // the row shows their median
  int inplace = 2;         // 0 out-of-place, 1 in-place, 2 both (nccl-tests prints both)
  bool check = true;       // the #wrong columns
  std::size_t rotate_bytes = std::size_t{8} << 20;  // rotate buffers up to this S; 0: never
  bool membw = true;       // measure the memory-bandwidth ceiling first
  bool mpi = true;         // under mpirun, also run MPI's own collective
  std::string json;        // also write header and rows here (rank 0)
  std::string command_line;
};

// Runs on every rank; rank 0 prints. Returns 0, or 1 when any element was wrong.
int run_collective(transport::Bootstrap& bootstrap, const CollectiveOptions& options);

}  // namespace dlop::bench
