// The seam between the engine and device streams: an operation on buffers
// staged from an accelerator may start only once the copy that fills them has
// finished on the device's stream. The backend (which alone knows torch's
// streams) hands the engine an event it can poll; the engine starts the
// operation, in submission order, once the event says the work before it is
// done. Nothing here knows what a device is.
#pragma once

#include <functional>
#include <string>

namespace dlop::sched {

class ReadyEvent {
 public:
  virtual ~ReadyEvent() = default;
  // Whether the work recorded before the event has finished. Called by the
  // engine's progress (any thread, under the engine lock): must not block.
  virtual bool ready() const = 0;
  // What the operation waits for, for a timeout's message.
  virtual std::string describe() const = 0;
  // An event that can say when it passes returns true and calls `wake` (on
  // any thread, at most once, at once if it has passed already) once ready()
  // is true: the engine then sleeps instead of polling it. The engine calls
  // this once for the event at the front of its gated operations.
  virtual bool notify_when_ready(std::function<void()> wake) const {
    (void)wake;
    return false;
  }
};

}  // namespace dlop::sched
