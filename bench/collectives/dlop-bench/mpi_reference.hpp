// The reference the collective benchmarks compare dlop with: the MPI
// library's own collectives (MPI_Allreduce, MPI_Allgather,
// MPI_Reduce_scatter_block, MPI_Bcast, MPI_Reduce, MPI_Alltoall, MPI_Barrier)
// on the same buffers. Compiled only when DLOP_HAVE_MPI.
//
// Types: MPI_FLOAT, MPI_DOUBLE, MPI_INT8_T ... MPI_INT64_T, MPI_UINT8_T,
// MPI_C_BOOL (sum, avg and max as MPI_LOR, prod and min as MPI_LAND, as
// dlop's kernels define them). half and bfloat16 travel as MPI_UINT16_T and
// reduce with a user-defined MPI_Op that calls dlop's reduction kernels
// (MPI has no such types; the op is as fast as dlop's own). MPI has no avg:
// it runs MPI_SUM and divides the result here, inside the timed call.
#pragma once

#include <mpi.h>

#include <string>

#include "coll_case.hpp"

namespace dlop::bench {

class MpiReference : public Runner {
 public:
  // Throws kInvalidArgument when op is not defined on dtype.
  MpiReference(MPI_Comm comm, coll::DataType dtype, coll::ReduceOp op);
  ~MpiReference() override;
  MpiReference(const MpiReference&) = delete;
  MpiReference& operator=(const MpiReference&) = delete;

  void run(const Call& call) override;

  // "Open MPI v4.1.4, ..." (the first line of MPI_Get_library_version).
  static std::string library_version();

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op op_ = MPI_OP_NULL;
  bool user_op_ = false;  // op_ was made by MPI_Op_create and must be freed
};

}  // namespace dlop::bench
