// Acts on device events as they pass, with no timer between: each internal
// stream has a thread (`dlop-stream-wait`) that waits for its events in turn,
// blocking in the device's own event wait, and runs what was asked for each
// as soon as it passes. A staged operation then starts the moment its copy
// out is done (the engine is woken, not polling), and a call's pinned buffers
// go back to their pool the moment its copies back are done.
//
// Events of one stream pass in the order they were recorded, so waiting for
// them in that order loses nothing. On CUDA a blocking event wait may spin its
// thread while it waits, as Gloo's waiting worker does.
#pragma once

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>

namespace dlop::backend {

// Runs `then` on the stream's waiting thread once `event`, recorded on
// `stream`, has passed (or failed: then still runs, and whoever asks the
// event hears of the failure). Keeps `event` alive until then.
void when_passed(const c10::Stream& stream, std::shared_ptr<const c10::Event> event, std::function<void()> then);

}  // namespace dlop::backend
