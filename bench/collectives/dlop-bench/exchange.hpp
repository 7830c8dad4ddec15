// dlop-bench exchange: every rank sends one message to every other rank at
// once (an all-to-all over the transport, no collective algorithm), contents
// checked; reports the time per exchange and each rank's send bandwidth.
#pragma once

#include <cstddef>
#include <string>

#include "transport/bootstrap.hpp"

namespace dlop::bench {

struct ExchangeOptions {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 4u << 20;
  std::size_t factor = 8;
  int repetitions = 9;
};

int run_exchange(transport::Bootstrap& bootstrap, const ExchangeOptions& options);

}  // namespace dlop::bench
