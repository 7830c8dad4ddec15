// select_algorithm (registry.hpp) that also says how it chose, for the
// scheduler's info log: "forced by DLOP_ALGO" or "tuning table", and the
// preferred algorithms that declined before the chosen one.
#pragma once

#include <string>

#include "collectives/registry.hpp"

namespace dlop::coll {

const Algorithm& select_algorithm(const CollArgs& args, const Group& group, const AlgorithmOverrides& overrides,
                                  std::string& why);

}  // namespace dlop::coll
