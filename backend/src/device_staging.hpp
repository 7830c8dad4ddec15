// Accelerator tensors staged through page-locked host memory, through torch's
// device-generic API only (c10::Stream, c10::Event, VirtualGuardImpl, the
// device's pinned-memory allocator): one code path for CUDA, ROCm, XPU and
// any PrivateUse1 device, the project's test accelerator included.
//
// A call on device tensors (staged_ops.cpp) goes:
//   1. an event on the caller's current stream; the process's copy-out stream
//      for the device waits on it, so the copies see the caller's earlier work;
//   2. device-to-host copies into pinned buffers on that stream, and an event
//      after them; the stream's waiting thread (stream_waiter.hpp) wakes the
//      engine as soon as it passes, and the engine starts the host operation
//      (sched::ReadyEvent: the engine never blocks on a device);
//   3. the host collective on the pinned buffers (the CPU implementation);
//   4. as each host operation finishes, host-to-device copies on the copy-in
//      stream, then an end event (work_device.hpp), which Work.wait() makes
//      the caller's current stream wait on.
// A large all-reduce or broadcast goes in chunks, each its own engine
// operation with its own event, so the copies of one chunk overlap the host
// collective of another.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "scheduler/ready_event.hpp"

namespace dlop::backend {

// The device of a call's tensors: CPU, or the one accelerator they are all
// on. Tensors on two devices are a ValueError naming both.
c10::Device call_device(std::initializer_list<const std::vector<at::Tensor>*> lists, std::string_view op);
inline c10::Device call_device(const std::vector<at::Tensor>& tensors, std::string_view op) {
  return call_device({&tensors}, op);
}
// The same for nested lists (all-gather outputs, scatter inputs).
std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists);

// The process's internal streams for a device: copies to the host, copies
// back (two, so that chunk i's copy back need not wait for chunk i+1's copy
// out), and copies into shared device memory (shared_device.hpp: queued late,
// each after its own caller's event, so they must not queue behind the
// copy-out stream's waits for later calls).
struct InternalStreams {
  c10::Stream to_host;
  c10::Stream to_device;
  c10::Stream into_shared;
};
// A device without an index (-1) is the current device.
InternalStreams internal_streams(c10::Device device);
c10::Device with_index(c10::Device device);

// Page-locked host buffers, per device type, kept and reused (allocating
// pinned memory costs far more than the copies it speeds up). A lease goes
// back to the pool when its last holder drops it.
std::shared_ptr<at::Tensor> pinned_bytes(c10::DeviceType type, std::size_t bytes);

// An event on a device stream as the engine sees it: recorded at once, and
// waited for by the stream's waiting thread, which marks it passed and wakes
// the engine. ready() only reads that mark: the engine never asks the device.
class StreamEvent final : public sched::ReadyEvent {
 public:
  using Clock = std::chrono::steady_clock;
  static std::shared_ptr<const StreamEvent> record(c10::Device device, const c10::Stream& stream);

  bool ready() const override;
  std::string describe() const override;
  bool notify_when_ready(std::function<void()> wake) const override;
  const c10::Event& event() const { return *event_; }
  // For the trace: when the waiting thread saw it pass, and when the engine
  // first found it ready (its operation starts then); epoch until then.
  Clock::time_point passed_at() const { return passed_at_.load(); }
  Clock::time_point started_at() const { return started_at_.load(); }

  StreamEvent(c10::Device device, const c10::Stream& stream);  // use record()

 private:
  void mark_passed() const;

  std::shared_ptr<c10::Event> event_;
  std::string what_;
  mutable std::mutex mutex_;
  mutable std::function<void()> wake_;  // mutex_
  mutable std::atomic<bool> passed_{false};
  mutable std::atomic<Clock::time_point> passed_at_{};
  mutable std::atomic<Clock::time_point> started_at_{};
};

// What a staged call keeps alive until its end event has passed: pinned
// leases, host stages, the device tensors the copies read and write.
struct StagedBuffers {
  std::vector<std::shared_ptr<at::Tensor>> leases;
  std::vector<at::Tensor> tensors;
};


// Keeps `buffers` (and so their pinned leases) until `event`, recorded on
// `stream`, has passed: the device is then done with them.
void retire_after(const c10::Stream& stream, std::shared_ptr<const c10::Event> event,
                  std::shared_ptr<StagedBuffers> buffers);

// One call's staging: the copies out, and the event the host operation waits for.
class DeviceCall {
 public:
  explicit DeviceCall(c10::Device device);
  ~DeviceCall();
  DeviceCall(const DeviceCall&) = delete;
  DeviceCall& operator=(const DeviceCall&) = delete;
  // The Work that now keeps the buffers until its end event.
  void hand_off() { handed_off_ = true; }
  c10::Device device() const { return device_; }
  const InternalStreams& streams() const { return streams_; }
  // A pinned, contiguous host copy of t (copy enqueued on the copy-out stream).
  at::Tensor to_host(const at::Tensor& t);
  // A pinned host tensor shaped as t, not filled (outputs).
  at::Tensor host_like(const at::Tensor& t);
  // `bytes` pinned host bytes, not filled.
  at::Tensor host_bytes(std::size_t bytes);
  // Records the event after the copies enqueued so far.
  std::shared_ptr<const StreamEvent> staged();
  // The first event staged() recorded (its host operation starts first), and
  // when the call began: the trace's timeline of the call.
  const std::shared_ptr<const StreamEvent>& first_staged() const { return first_staged_; }
  StreamEvent::Clock::time_point begun_at() const { return begun_at_; }
  const std::shared_ptr<StagedBuffers>& buffers() const { return buffers_; }

 private:
  c10::Device device_;  // with its index: the streams are looked up by it
  InternalStreams streams_;
  std::shared_ptr<StagedBuffers> buffers_ = std::make_shared<StagedBuffers>();
  std::shared_ptr<const StreamEvent> first_staged_;
  StreamEvent::Clock::time_point begun_at_ = StreamEvent::Clock::now();
  bool handed_off_ = false;
};

// While one exists on a thread, the host operations it submits wait for
// `ready` and never complete on the caller's thread (the device call's Work
// does its waiting): process_group_dlop.cpp's op_options and caller_waits.
class DeviceScope {
 public:
  explicit DeviceScope(std::shared_ptr<const sched::ReadyEvent> ready);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  static bool active();
  static const std::shared_ptr<const sched::ReadyEvent>& ready();

 private:
  std::shared_ptr<const sched::ReadyEvent> previous_;
  bool was_active_;
};

}  // namespace dlop::backend
