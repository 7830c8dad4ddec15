// An algorithm running one collective: a non-blocking state machine.
#pragma once

#include <memory>
#include <vector>

#include "collectives/coll_args.hpp"
#include "collectives/group.hpp"
#include "transport/request.hpp"

namespace dlop::coll {

// Tags: the scheduler gives each operation a base tag with the low kStepBits
// clear; an algorithm adds its own step numbers below that.
inline constexpr int kStepBits = 12;
inline constexpr transport::Tag kMaxStep = (transport::Tag{1} << kStepBits) - 1;

class Task {
 public:
  virtual ~Task() = default;
  // Advances as far as it can without blocking (the first call posts the
  // first messages). Returns true once this rank's part is complete and the
  // output buffers hold the result. Throws dlop::Error on failure.
  virtual bool progress() = 0;
  // Group ranks this task waits for other than through transport requests
  // (e.g. on shared-memory flags), for timeout messages; empty if none.
  virtual std::vector<int> waiting_for() const { return {}; }
  // True when the task waits on flags in shared memory: their posting wakes
  // no sleeper, so while it runs the engine yields instead of sleeping on
  // UCX's event fd (which would add up to a poll timeout per late peer).
  virtual bool polls_memory() const { return false; }
  // True when the next progress() call has work that awaits no peer (the
  // next chunk of a reduction): the engine calls again rather than sleep
  // until an event that will not come.
  virtual bool has_local_work() const { return false; }
};

// Requests of one step; done when all are.
class RequestSet {
 public:
  void add(transport::Request request) { requests_.push_back(std::move(request)); }
  // Tests every pending request (throwing its error); true when none is left.
  bool test_all();
  bool empty() const { return requests_.empty(); }

 private:
  std::vector<transport::Request> requests_;
};

}  // namespace dlop::coll
