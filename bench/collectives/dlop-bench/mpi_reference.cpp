#include "mpi_reference.hpp"

#include <fmt/format.h>

#include <climits>

#include "collectives/reduce.hpp"
#include "core/error.hpp"
#include "transport/mpi_bootstrap.hpp"

namespace dlop::bench {
namespace {

using coll::CollKind;
using coll::DataType;
using coll::ReduceOp;

using transport::check_mpi;

MPI_Datatype mpi_type(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kFloat16:
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kBool: return MPI_C_BOOL;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op predefined_op(ReduceOp op, DataType dtype) {
  if (dtype == DataType::kBool) {
    switch (op) {
      case ReduceOp::kProd:
      case ReduceOp::kMin:
      case ReduceOp::kBand: return MPI_LAND;
      case ReduceOp::kBxor: return MPI_LXOR;
      default: return MPI_LOR;  // sum, avg, max, bor
    }
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kBand: return MPI_BAND;
    case ReduceOp::kBor: return MPI_BOR;
    case ReduceOp::kBxor: return MPI_BXOR;
  }
  return MPI_OP_NULL;
}

// half and bfloat16: MPI_User_function over MPI_UINT16_T, inout = in op inout.
template <DataType D, ReduceOp O>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  coll::reduce_inplace(O, D, inout, in, static_cast<std::size_t>(*len));
}

template <DataType D>
MPI_User_function* user_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return reduce_16bit<D, ReduceOp::kSum>;
    case ReduceOp::kProd: return reduce_16bit<D, ReduceOp::kProd>;
    case ReduceOp::kMin: return reduce_16bit<D, ReduceOp::kMin>;
    case ReduceOp::kMax: return reduce_16bit<D, ReduceOp::kMax>;
    default: return nullptr;  // bitwise: refused by check_reduction
  }
}

int to_int(std::size_t count) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw_error(Errc::kInvalidArgument, fmt::format("MPI counts are int: {} elements is too many", count));
  }
  return static_cast<int>(count);
}

}  // namespace

MpiReference::MpiReference(MPI_Comm comm, DataType dtype, ReduceOp op) : comm_(comm), type_(mpi_type(dtype)) {
  coll::check_reduction(op, dtype);
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) {
    MPI_User_function* f = dtype == DataType::kFloat16 ? user_function<DataType::kFloat16>(op)
                                                        : user_function<DataType::kBFloat16>(op);
    check_mpi(MPI_Op_create(f, 1, &op_), "MPI_Op_create");
    user_op_ = true;
  } else {
    op_ = predefined_op(op, dtype);
  }
}

MpiReference::~MpiReference() {
  if (user_op_) MPI_Op_free(&op_);
}

void MpiReference::run(const Call& c) {
  const int count = to_int(c.count);
  void* send = const_cast<void*>(c.send);
  switch (c.kind) {
    case CollKind::kAllreduce:
      check_mpi(MPI_Allreduce(c.in_place ? MPI_IN_PLACE : send, c.recv, count, type_, op_, comm_), "MPI_Allreduce");
      break;
    case CollKind::kReduce:
      if (c.in_place && rank_ == c.root) {
        check_mpi(MPI_Reduce(MPI_IN_PLACE, c.recv, count, type_, op_, c.root, comm_), "MPI_Reduce");
      } else {
        check_mpi(MPI_Reduce(send, rank_ == c.root ? c.recv : nullptr, count, type_, op_, c.root, comm_), "MPI_Reduce");
      }
      break;
    case CollKind::kReduceScatter:
      check_mpi(MPI_Reduce_scatter_block(c.in_place ? MPI_IN_PLACE : send, c.recv, count, type_, op_, comm_),
                "MPI_Reduce_scatter_block");
      break;
    case CollKind::kAllgather:
      if (c.in_place) {
        check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c.recv, count, type_, comm_), "MPI_Allgather");
      } else {
        check_mpi(MPI_Allgather(send, count, type_, c.recv, count, type_, comm_), "MPI_Allgather");
      }
      break;
    case CollKind::kAlltoall:
      if (c.in_place) {
        check_mpi(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c.recv, count, type_, comm_), "MPI_Alltoall");
      } else {
        check_mpi(MPI_Alltoall(send, count, type_, c.recv, count, type_, comm_), "MPI_Alltoall");
      }
      break;
    case CollKind::kBroadcast:
      check_mpi(MPI_Bcast(c.recv, count, type_, c.root, comm_), "MPI_Bcast");
      break;
    case CollKind::kBarrier:
      check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
      break;
    default:
      throw_error(Errc::kInvalidArgument, fmt::format("no MPI reference for {}", coll::kind_name(c.kind)));
  }
  // MPI has no avg: the sum is divided here, where the result is.
  if (c.op == ReduceOp::kAvg && reduces(c.kind) && (c.kind != CollKind::kReduce || rank_ == c.root)) {
    coll::finalize(ReduceOp::kAvg, c.dtype, c.recv, c.count, size_);
  }
}

std::string MpiReference::library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "unknown MPI";
  std::string version(text, static_cast<std::size_t>(len));
  const auto end = version.find_first_of(",\n");
  return end == std::string::npos ? version : version.substr(0, end);
}

}  // namespace dlop::bench
