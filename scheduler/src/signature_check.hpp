// DLOP_DEBUG=detail: before an operation runs, every rank sends a signature
// of it (kind, count, dtype, reduction, root, sequence number) to every other
// rank, and a mismatch fails the operation on every rank, naming both sides.
#pragma once

#include <memory>

#include "collectives/registry.hpp"
#include "op_state.hpp"

namespace dlop::sched {

// Operation `seq` of comm; the algorithm's task is made once the signatures
// matched and every earlier operation's task was made.
std::unique_ptr<coll::Task> make_signature_checked(const coll::CollArgs& args, CommState& comm, transport::Tag base_tag,
                                                   std::uint64_t seq, const coll::Algorithm& algorithm);

}  // namespace dlop::sched
