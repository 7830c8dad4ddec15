// A task made of independent columns that each run the same sequence of
// steps (private to collectives/algorithms).
//
// An algorithm cuts its data into columns (chunks of the vector, or chunk k
// of every block) and describes one step of one column: at most one send and
// one receive, then local work once both have completed (a reduction). Up to
// `window` columns are in flight at once, each in its own lane; lane l's
// messages carry the tag base_tag + l. Column c runs in lane c % window and
// starts only once column c - window has finished, so for every pair of ranks
// and tag, both sides post their messages in the same order (column, then
// step): UCX matches them in that order, whatever the timing.
//
// Scratch memory is per lane, owned here so that it outlives the requests
// that may still use it; transfers of zero bytes are skipped on both sides
// (sizes are a function of the layout, known to both).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "collectives/task.hpp"

namespace dlop::coll {

// The transfers of one step of one column; a peer of -1 or zero bytes means none.
struct StepIo {
  int send_to = -1;
  const void* send_data = nullptr;
  std::size_t send_bytes = 0;
  int recv_from = -1;
  void* recv_data = nullptr;
  std::size_t recv_bytes = 0;
};

class LanePipelineTask : public Task {
 public:
  bool progress() final;

 protected:
  LanePipelineTask(const Group& group, transport::Tag base_tag) : group_(group), base_tag_(base_tag) {}

  // Called once by the subclass's constructor. No columns or no steps: only
  // begin() and end() run. Each lane gets scratch_per_lane bytes of scratch.
  void configure(std::size_t columns, int steps, std::size_t window, std::size_t scratch_per_lane = 0);

  // On the first progress(), before anything is posted (local copies).
  virtual void begin() {}
  // The transfers of `step` of `column`; may do local work first (it runs
  // when the step is posted, after the previous step of the column finished).
  virtual StepIo plan(std::size_t column, int step, std::size_t lane) = 0;
  // After both transfers of the step completed.
  virtual void finish(std::size_t /*column*/, int /*step*/, std::size_t /*lane*/) {}
  // Once every column has finished, before progress() first returns true.
  virtual void end() {}

  const Group& group() const { return group_; }
  // The lane's scratch, aligned to 64 bytes.
  std::byte* scratch(std::size_t lane) const { return scratch_base_ + lane * scratch_stride_; }

 private:
  struct Lane {
    bool busy = false;
    bool posted = false;
    std::size_t column = 0;
    int step = 0;
    std::size_t expected = 0;  // bytes the receive must bring
    bool receiving = false;
    transport::Request send;
    transport::Request recv;
  };

  // Moves the lane on as far as it can; true when anything changed.
  bool advance(Lane& lane, std::size_t index);
  void post(Lane& lane, std::size_t index);

  const Group& group_;
  transport::Tag base_tag_;
  std::size_t columns_ = 0;
  int steps_ = 0;
  std::size_t scratch_stride_ = 0;
  std::unique_ptr<std::byte[]> scratch_;  // before lanes_: freed after their requests
  std::byte* scratch_base_ = nullptr;     // scratch_, aligned
  std::vector<Lane> lanes_;
  std::size_t next_column_ = 0;
  std::size_t finished_columns_ = 0;
  bool begun_ = false;
  bool done_ = false;
};

}  // namespace dlop::coll
