// WorkDevice: the c10d::Work of a call on accelerator tensors staged through
// host memory (device_staging.hpp), with ProcessGroupNCCL's stream semantics:
//   - wait() returns once the host operations are done and the copies back
//     are queued, having made the caller's current stream wait for them: the
//     host does not wait for the device (it waits for the host collective,
//     which is host work, as Gloo's CUDA path does);
//   - synchronize() is wait() without a timeout; isCompleted() is true once
//     the device has finished the copies back;
//   - getFuture() is a future on the device: its value is ready on the
//     streams of whoever waits on it (torch records and waits the events);
//   - the tensors, host stages and pinned leases stay alive until the end
//     event has passed, whether or not the caller keeps the Work (the copy-in
//     stream's waiting thread lets them go, stream_waiter.hpp);
//   - with DLOP_TRACE, the call's timeline is one span ("staged <op>": copy
//     out done, host operation started and done, future completed, copies
//     back done) and the completion path one more ("complete").
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "device_staging.hpp"

namespace dlop::backend {

class WorkDevice : public c10d::Work {
 public:
  // One host operation and what it copies back to the device when it is done.
  struct Step {
    c10::intrusive_ptr<c10d::Work> host;
    std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (device tensor, host stage)
    // Run first when the host operation ends, with its error if it failed,
    // on the copy-back stream (shared_device.hpp queues its reduce there);
    // what it throws fails the call.
    std::function<void(std::exception_ptr)> then;
  };

  // Takes over the call's buffers.
  WorkDevice(int rank, c10d::OpType type, DeviceCall& call, std::vector<at::Tensor> outputs);
  // Hooks the steps up; call once, right after construction.
  void start(std::vector<Step> steps);

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override;

 private:
  void step_done(std::size_t index, std::exception_ptr error);
  void trace_call(StreamEvent::Clock::time_point copied_back) const;

  c10::Device device_;
  InternalStreams streams_;
  std::shared_ptr<const StreamEvent> staged_;  // after the last copy out
  std::shared_ptr<const StreamEvent> first_staged_;
  StreamEvent::Clock::time_point begun_at_;
  StreamEvent::Clock::time_point hosts_done_at_;  // mutex_
  StreamEvent::Clock::time_point future_at_;      // mutex_
  std::shared_ptr<std::atomic<bool>> copied_back_done_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<StagedBuffers> buffers_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<Step> steps_;

  mutable std::mutex mutex_;
  std::condition_variable copied_back_;
  std::size_t steps_left_ = 0;          // mutex_
  std::exception_ptr error_;            // mutex_: the first step's error
  std::shared_ptr<c10::Event> end_;     // mutex_: recorded once every step is done
};

}  // namespace dlop::backend
