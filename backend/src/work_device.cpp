#include "work_device.hpp"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "backend/work_dlop.hpp"
#include "core/error.hpp"

namespace dlop::backend {

WorkDevice::WorkDevice(int rank, c10d::OpType type, DeviceCall& call, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      device_(call.device()),
      streams_(call.streams()),
      buffers_(call.buffers()),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(), std::vector<c10::Device>{device_})) {
  // Covers every copy out: the end event, recorded after it, then means
  // that the device is done with the call's tensors, inputs included.
  staged_ = call.staged();
  call.hand_off();
}

void WorkDevice::start(std::vector<Step> steps) {
  steps_ = std::move(steps);
  {
    std::lock_guard lock(mutex_);
    steps_left_ = steps_.size() + 1;  // +1: start itself
  }
  auto self = c10::intrusive_ptr<WorkDevice>::reclaim_copy(this);
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    steps_[i].host->getFuture()->addCallback([self, i](c10::ivalue::Future& done) {
      self->step_done(i, done.hasError() ? done.exception_ptr() : nullptr);
    });
  }
  step_done(steps_.size(), nullptr);
}

void WorkDevice::step_done(std::size_t index, std::exception_ptr error) {
  const c10::StreamGuard guard(streams_.to_device);
  if (!error && index < steps_.size()) {
    try {
      for (auto& [device_tensor, host] : steps_[index].copy_back) {
        if (device_tensor.numel() != 0) device_tensor.copy_(host, /*non_blocking=*/true);
      }
    } catch (...) {
      error = to_torch_error(std::current_exception());
    }
  }
  std::unique_lock lock(mutex_);
  if (error && !error_) error_ = error;
  if (--steps_left_ != 0) return;
  staged_->event().block(streams_.to_device);
  auto end = std::make_shared<c10::Event>(device_.type());
  end->record(streams_.to_device);
  end_ = end;
  const auto failure = error_;
  lock.unlock();
  copied_back_.notify_all();
  retire_when_done([end] { return end->query(); }, buffers_);
  // The future's events are recorded on the current stream: the copy-in stream.
  if (failure) {
    future_->setError(failure);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(failure);
}

bool WorkDevice::isCompleted() {
  std::lock_guard lock(mutex_);
  return end_ && (error_ || end_->query());
}

bool WorkDevice::wait(std::chrono::milliseconds timeout) {
  const bool bounded = timeout != kNoTimeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& step : steps_) {
    if (!bounded) {
      step.host->wait();
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    step.host->wait(std::max(left, std::chrono::milliseconds(0)));
  }
  std::unique_lock lock(mutex_);
  // The last host step's callback may still be queueing its copies back.
  copied_back_.wait(lock, [&] { return end_ != nullptr; });
  if (error_) std::rethrow_exception(error_);
  const c10::impl::VirtualGuardImpl impl(device_.type());
  end_->block(impl.getStream(device_));
  return true;
}

void WorkDevice::synchronize() { wait(kNoTimeout); }

int WorkDevice::sourceRank() const { return steps_.empty() ? -1 : steps_.front().host->sourceRank(); }

}  // namespace dlop::backend
