// Drives one collective algorithm to completion on a group, without the engine.
#pragma once

#include <chrono>
#include <string_view>

#include "collectives/registry.hpp"

namespace dlop::test {

// The algorithm named for args.kind; throws if none is registered by that name.
const coll::Algorithm& find_algorithm(coll::CollKind kind, std::string_view name);

// Creates the named algorithm's task for args (it must accept them) and
// progresses it until done; throws dlop::Error on failure or timeout.
void run_collective(const coll::Group& group, const coll::CollArgs& args, std::string_view algorithm,
                    transport::Tag base_tag, std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace dlop::test
