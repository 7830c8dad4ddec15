// Acts on device events as they pass, with no timer between: each internal
// stream has a thread (`dlop-streamwait`) that waits for its events in turn,
// blocking in the device's own event wait, and runs what was asked for each
// as soon as it passes. A staged operation then starts the moment its copy
// out is done (the engine is woken, not polling), and a call's pinned buffers
// go back to their pool the moment its copies back are done.
//
// Events of one stream pass in the order they were recorded, so waiting for
// them in that order loses nothing. The thread never spins: c10::Event's wait
// is cudaEventSynchronize, which spins a core for the whole wait unless the
// event was made with a blocking-sync flag that torch's device-generic API
// cannot ask for, and that API has no host callbacks. So it asks the event
// (one cheap query), and sleeps between asks for a sixteenth of the time
// waited so far (at least 20 us, at most 2 ms): a 200 ms kernel costs about
// 150 queries, and an event is seen at most 1/16 of its wait, or 2 ms, late.
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
