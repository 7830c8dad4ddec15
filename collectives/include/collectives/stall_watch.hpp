// Liveness checks for waits on shared-memory flags.
#pragma once

#include <cstdint>
#include <string_view>

#include "collectives/group.hpp"

namespace dlop::coll {

// Names a dead peer instead of waiting for it until the timeout. The mesh's
// own watchdog runs when something progresses the mesh; between ranks that
// only share memory nothing may, so a task waiting on a peer's flag calls
// stalled() and it checks at the same interval.
class StallWatch {
 public:
  // Throws kPeerDead naming `peer` when the mesh knows it died before its
  // `what` `seq` (e.g. "input of round 12") reached `algorithm`'s flags.
  void stalled(const Group& group, int peer, std::uint64_t seq, std::string_view algorithm, std::string_view what);

 private:
  unsigned polls_ = 0;
  std::int64_t next_check_ms_ = 0;
};

}  // namespace dlop::coll
