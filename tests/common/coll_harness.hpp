// Drives one collective algorithm to completion on a group, without the engine.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/registry.hpp"

namespace dlop::test {

// The algorithm named for args.kind; throws if none is registered by that name.
const coll::Algorithm& find_algorithm(coll::CollKind kind, std::string_view name);

// Creates the named algorithm's task for args (it must accept them) and
// progresses it until done; throws dlop::Error on failure or timeout.
void run_collective(const coll::Group& group, const coll::CollArgs& args, std::string_view algorithm,
                    transport::Tag base_tag, std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Several collectives in flight at once on one group: ops[k] (its args and
// algorithm) gets base tag (first_tag + k) << kStepBits; all are progressed
// round robin from ops[first % size], so ranks that start at different ops
// interleave them differently. Throws dlop::Error on timeout.
struct InFlight {
  const coll::CollArgs& args;
  std::string_view algorithm;
};
void run_interleaved(const coll::Group& group, const std::vector<InFlight>& ops, transport::Tag first_tag,
                     std::size_t first, std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Runs body(bootstrap, group, next_tag) on `ranks` processes, each with its own
// UCX worker, mesh and a group of all ranks; next_tag() hands every collective
// a fresh base tag. The mesh is fenced before it is torn down.
using GroupBody = std::function<void(transport::Bootstrap& bootstrap, const coll::Group& group,
                                     const std::function<transport::Tag()>& next_tag)>;
void run_on_group(int ranks, const GroupBody& body);
// As run_on_group, with rank r on the "host" named hosts[r] (the mesh's host
// option, as DLOP_HOST_ID would set it): ranks with different host names
// reach each other over the network transports, as on a real cluster.
void run_on_hosts(const std::vector<std::string>& hosts, const GroupBody& body);

}  // namespace dlop::test
