// Runs a test body as N real processes (ranks), forked by the test itself.
// Each rank gets a Bootstrap over a FileStore in a fresh directory. A rank's
// GoogleTest failures, exceptions and crashes become a failure in the parent.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "transport/bootstrap.hpp"

namespace dlop::test {

using RankBody = std::function<void(transport::Bootstrap& bootstrap)>;

struct RankExit {
  int rank = 0;
  bool exited = false;   // false: killed by a signal
  int code = 0;          // exit code, or the signal number
};

// Starts `size` ranks running body and returns their pids without waiting.
class RankGroup {
 public:
  RankGroup(int size, RankBody body);
  ~RankGroup();  // kills ranks still running
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  pid_t pid(int rank) const { return pids_.at(rank); }
  const std::string& store_dir() const { return dir_; }
  // Waits for every rank, at most `timeout` in all; stragglers are killed and
  // reported as killed by SIGKILL.
  std::vector<RankExit> wait(std::chrono::milliseconds timeout = std::chrono::minutes(5));

 private:
  std::string dir_;
  std::vector<pid_t> pids_;
};

// Runs the ranks to completion and adds a GoogleTest failure for each rank
// that did not exit with code 0.
void run_ranks(int size, const RankBody& body,
               std::chrono::milliseconds timeout = std::chrono::minutes(5));

// A fresh temporary directory, removed by the caller.
std::string make_temp_dir();

}  // namespace dlop::test
