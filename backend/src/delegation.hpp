// Calls delegated to the device's own backend (ProcessGroupNCCL, or Gloo for
// CPU tensors as a test setting) are still gradient traffic to the engine:
// offloaded batches are paced around them as around dlop's own collectives.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>

#include "scheduler/data_credits.hpp"

namespace dlop::backend {

// Counts `work` as a gradient collective in flight from now until it has
// completed. A CPU backend's future completes with its work. A device
// backend's may complete when the work is queued (NCCL's does): there
// completion is what Work::isCompleted() says, checked when the future
// completes, then polled by a tracking thread until true.
void count_until_done(const c10::intrusive_ptr<c10d::Work>& work, const std::shared_ptr<sched::DataCredits>& credits);

}  // namespace dlop::backend
