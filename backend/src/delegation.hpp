// Calls delegated to the device's own backend (ProcessGroupNCCL, or Gloo for
// CPU tensors as a test setting) are still gradient traffic to the engine:
// offloaded batches are paced around them as around dlop's own collectives.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>

#include "scheduler/data_credits.hpp"

namespace dlop::backend {

// Counts `work`, a delegated call on `device`, as a gradient collective in
// flight from now until it has ended, with no thread of its own:
//   - on the CPU, a backend's future completes with its work: its callback
//     ends the count (a Work without a future is asked, as below);
//   - on a device, the future may complete when the work is queued (NCCL's
//     does), so the end is what Work::isCompleted() says. The credits ask it
//     lazily, when they are consulted (DataCredits::gradient_until), and so
//     does each delegated call.
//   - under graph capture (the device's current stream is capturing), the
//     call runs at each replay, which dlop does not see: it is not counted,
//     and no event may be queried during a capture. Works counted before it
//     are taken as ended, unasked: torch.cuda.graph synchronizes the device
//     before it captures.
void count_until_done(const c10::intrusive_ptr<c10d::Work>& work, c10::Device device,
                      const std::shared_ptr<sched::DataCredits>& credits);

}  // namespace dlop::backend
