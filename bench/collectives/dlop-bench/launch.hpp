// How dlop-bench finds its peers: under mpirun (MPI bootstrap), with an
// explicit TCP store (--rank/--size/--store), or by forking local ranks itself.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "transport/bootstrap.hpp"

namespace dlop::bench {

struct LaunchOptions {
  int rank = -1;
  int size = -1;
  std::string store;  // host:port; rank 0 serves it
  int local = 0;      // fork this many ranks on this host
};

using RankMain = std::function<int(transport::Bootstrap&)>;

// True when started by mpirun/srun (the MPI bootstrap applies).
bool launched_by_mpi();

// Runs body on every rank according to the options; returns the exit code
// (for --local, the worst of the ranks').
int launch(const LaunchOptions& options, const RankMain& body);

}  // namespace dlop::bench
