#include "work_device.hpp"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <fmt/format.h>

#include <numeric>

#include "backend/work_dlop.hpp"
#include "core/error.hpp"
#include "core/trace.hpp"
#include "stream_waiter.hpp"

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
  first_staged_ = call.first_staged();
  begun_at_ = call.begun_at();
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
  if (index < steps_.size() && steps_[index].then) {
    try {
      steps_[index].then(error);
    } catch (...) {
      error = to_torch_error(std::current_exception());
    }
  }
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
  const bool tracing = trace::enabled();
  if (tracing) hosts_done_at_ = StreamEvent::Clock::now();
  staged_->event().block(streams_.to_device);
  auto end = std::make_shared<c10::Event>(device_.type());
  end->record(streams_.to_device);
  end_ = end;
  const auto failure = error_;
  lock.unlock();
  copied_back_.notify_all();
  auto self = c10::intrusive_ptr<WorkDevice>::reclaim_copy(this);
  // The buffers go to the waiting thread alone: a Work the caller keeps
  // (until its next step's call, often) must not keep its pinned leases.
  when_passed(streams_.to_device, end,
              [done = copied_back_done_, buffers = std::move(buffers_),
               traced = tracing ? self : c10::intrusive_ptr<WorkDevice>()]() mutable {
                done->store(true, std::memory_order_release);
                if (traced) traced->trace_call(StreamEvent::Clock::now());
                buffers.reset();
              });
  // The future's events are recorded on the current stream: the copy-in stream.
  if (failure) {
    future_->setError(failure);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  if (tracing) {
    std::lock_guard again(mutex_);
    future_at_ = StreamEvent::Clock::now();
    trace::span("complete", "device", hosts_done_at_, future_at_, {{"op", std::string(c10d::opTypeToString(opType_))}});
  }
  finish(failure);
}

void WorkDevice::trace_call(StreamEvent::Clock::time_point copied_back) const {
  const auto us = [&](StreamEvent::Clock::time_point t) -> std::int64_t {
    if (t == StreamEvent::Clock::time_point{}) return -1;
    return std::chrono::duration_cast<std::chrono::microseconds>(t - begun_at_).count();
  };
  std::lock_guard lock(mutex_);
  trace::span(fmt::format("staged {}", c10d::opTypeToString(opType_)), "device", begun_at_, copied_back,
              {{"copy_out_us", us(staged_->passed_at())},
               {"host_start_us", us(first_staged_ ? first_staged_->started_at() : StreamEvent::Clock::time_point{})},
               {"host_end_us", us(hosts_done_at_)},
               {"future_us", us(future_at_)},
               {"copy_back_us", us(copied_back)},
               {"bytes", static_cast<std::int64_t>(std::accumulate(
                             outputs_.begin(), outputs_.end(), std::size_t{0},
                             [](std::size_t n, const at::Tensor& t) { return n + t.nbytes(); }))}});
}

bool WorkDevice::isCompleted() {
  std::lock_guard lock(mutex_);
  // The waiting thread marks it a moment after the device passes the event.
  return end_ && (error_ || copied_back_done_->load(std::memory_order_acquire) || end_->query());
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
