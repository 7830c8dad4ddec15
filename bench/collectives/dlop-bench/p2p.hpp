// dlop-bench p2p: ping-pong latency and streaming bandwidth between two ranks
// over dlop's transport, measured the way ucx_perftest measures tag_lat/tag_bw.
#pragma once

#include <cstddef>
#include <string>

#include "core/config.hpp"
#include "transport/bootstrap.hpp"

namespace dlop::bench {

struct P2pOptions {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 256u << 20;
  std::size_t factor = 2;
  int repetitions = 9;          // the reported figure is their median
  ProgressMode progress = ProgressMode::kSpin;
  std::string json;             // write the rows here too
};

int run_p2p(transport::Bootstrap& bootstrap, const P2pOptions& options);

}  // namespace dlop::bench
