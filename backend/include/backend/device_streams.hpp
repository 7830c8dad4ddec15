// What a staged device call would use, for tests: the stream its copies to
// the host go on (backend/src/device_staging.hpp). A device without an index
// (-1) is the calling thread's current device.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace dlop::backend {

c10::Stream device_call_stream(c10::Device device);

}  // namespace dlop::backend
