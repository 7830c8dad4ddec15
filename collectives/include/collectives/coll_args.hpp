// What a collective operation is asked to do, independent of the algorithm.
// Counts are in elements. Conventions follow MPI:
//   allreduce       send[count] -> recv[count] on every rank (send == recv: in place)
//   broadcast       recv[count]: the root's contents end up on every rank
//   reduce          send[count] -> recv[count] on the root only
//   allgather       send[count] -> recv[count * n], rank r's block at r * count
//   allgatherv      send[counts[me]] -> recv[sum(counts)], blocks in rank order
//   gather          send[count] -> recv[count * n] on the root
//   scatter         send[count * n] on the root -> recv[count]
//   reduce_scatter  send[count * n] -> recv[count], the reduced block `me`
//   reduce_scatterv send[sum(counts)] -> recv[counts[me]]
//   alltoall        send[count * n] -> recv[count * n], block r goes to / comes from rank r
//   alltoallv       send blocks of send_counts[r], recv blocks of counts[r], in rank order
//   barrier         nothing
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "collectives/types.hpp"

namespace dlop::coll {

enum class CollKind : std::uint8_t {
  kAllreduce, kBroadcast, kReduce, kAllgather, kAllgatherv, kGather, kScatter,
  kReduceScatter, kReduceScatterv, kAlltoall, kAlltoallv, kBarrier,
};

std::string_view kind_name(CollKind kind);  // "allreduce", "broadcast", ... (as in DLOP_ALGO)
CollKind parse_kind(std::string_view name);  // throws kInvalidArgument

struct CollArgs {
  CollKind kind = CollKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<std::size_t> counts;       // v-variants: per-rank receive counts
  std::vector<std::size_t> send_counts;  // alltoallv: per-rank send counts

  bool in_place() const { return send == recv; }
  std::size_t element_size() const { return dtype_size(dtype); }
  // Bytes of one rank's contribution: what algorithm selection keys on.
  std::size_t bytes() const;
};

}  // namespace dlop::coll
