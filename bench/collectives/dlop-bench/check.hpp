// The #wrong column (as nccl-tests): after the timed runs, every rank fills its
// input with a known pattern, the collective runs once, and each rank counts
// the elements of its output that differ from the result computed here.
//
// Patterns are small integers, exact in every data type (bfloat16 holds the
// integers up to 256) and in every partial sum of up to ~30 ranks, so results
// are compared exactly whatever the order of reduction; integer types wrap as
// dlop's kernels do. Only avg of floating types, whose division may round,
// gets a tolerance of a few units in the last place. Outputs are poisoned
// first, so an element never written counts as wrong.
#pragma once

#include <cstddef>

#include "coll_case.hpp"

namespace dlop::bench {

// Poisons this rank's output (call.recv) and then writes its input (call.send).
void prepare_check(const Call& call, const CollLayout& layout, int rank, int ranks);

// The elements of this rank's output that differ from the expected result
// (0 where the rank has no output: reduce on a non-root, barrier).
std::size_t count_wrong(const Call& call, const CollLayout& layout, int rank, int ranks);

}  // namespace dlop::bench
