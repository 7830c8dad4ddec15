#include "coll_case.hpp"

#include "core/error.hpp"

namespace dlop::bench {

using coll::CollKind;

CollLayout make_layout(CollKind kind, std::size_t bytes, coll::DataType dtype, int ranks) {
  const std::size_t elt = coll::dtype_size(dtype);
  const std::size_t n = static_cast<std::size_t>(ranks);
  const double spread = static_cast<double>(n - 1) / static_cast<double>(n);  // (n-1)/n
  CollLayout l;
  l.kind = kind;
  switch (kind) {
    case CollKind::kAllreduce:
    case CollKind::kBroadcast:
    case CollKind::kReduce:
      l.count = l.in_elems = l.out_elems = bytes / elt;
      l.bytes = l.count * elt;
      l.busbw_factor = kind == CollKind::kAllreduce ? 2 * spread : 1.0;
      return l;
    case CollKind::kAllgather:
    case CollKind::kReduceScatter:
    case CollKind::kAlltoall:
      l.count = bytes / (elt * n);
      l.bytes = l.count * n * elt;
      l.in_elems = kind == CollKind::kAllgather ? l.count : l.count * n;
      l.out_elems = kind == CollKind::kReduceScatter ? l.count : l.count * n;
      l.busbw_factor = spread;
      return l;
    case CollKind::kBarrier:
      return l;
    default:
      throw_error(Errc::kInvalidArgument,
                  fmt::format("dlop-bench has no benchmark for {}", coll::kind_name(kind)));
  }
}

bool reduces(CollKind kind) {
  return kind == CollKind::kAllreduce || kind == CollKind::kReduce || kind == CollKind::kReduceScatter;
}

bool rooted(CollKind kind) { return kind == CollKind::kBroadcast || kind == CollKind::kReduce; }

bool has_out_of_place(CollKind kind) { return kind != CollKind::kBroadcast && kind != CollKind::kBarrier; }

}  // namespace dlop::bench
