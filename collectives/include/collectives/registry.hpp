// The algorithms and how one is chosen for an operation.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/coll_args.hpp"
#include "collectives/group.hpp"
#include "collectives/task.hpp"

namespace dlop::coll {

struct Algorithm {
  CollKind kind;
  std::string_view name;  // as DLOP_ALGO spells it, e.g. "ring"
  // Whether it can serve this case; an algorithm that cannot declines and the
  // next one is chosen.
  std::function<bool(const CollArgs&, const Group&)> accepts;
  std::function<std::unique_ptr<Task>(const CollArgs&, const Group&, transport::Tag base_tag)> create;
};

// Every algorithm, in no particular order.
const std::vector<Algorithm>& all_algorithms();

// Forced choices, from DLOP_ALGO="allreduce:ring,broadcast:binomial".
struct AlgorithmOverrides {
  std::vector<std::pair<CollKind, std::string>> forced;
  static AlgorithmOverrides parse(std::string_view text);  // throws naming a bad entry
};

// The algorithm for this operation: the forced one if it accepts (else an
// error naming why), otherwise the first in the tuning table that accepts.
const Algorithm& select_algorithm(const CollArgs& args, const Group& group, const AlgorithmOverrides& overrides);

// Registration hooks, one per algorithm family (collectives/algorithms/*.cpp).
void register_allreduce_family(std::vector<Algorithm>& out);  // allreduce, reduce_scatter(v), allgather(v)
void register_rooted_family(std::vector<Algorithm>& out);     // broadcast, reduce, gather, scatter
void register_exchange_family(std::vector<Algorithm>& out);   // alltoall(v), barrier
void register_shm_family(std::vector<Algorithm>& out);        // intra-host shared-memory variants

}  // namespace dlop::coll
