// What the daemon's sends and the client's receives of batches over UCX must
// agree on, defined once for both sides.
#pragma once

#include <optional>
#include <string>

#include "core/error.hpp"
#include "transport/request.hpp"
#include "transport/ucx_worker.hpp"

namespace dlop::offload {

// The put rendezvous, asked for on both sides: UCX 1.13 chooses the scheme
// where the send starts, so the daemon needs it too for a batch to be written
// straight into the trainer's buffer.
inline transport::UcxWorker::Options batch_worker_options() {
  transport::UcxWorker::Options o;
  o.ucx_config = {{"RNDV_SCHEME", "put_zcopy"}};
  return o;
}

// nullopt if the finished request succeeded, else why not.
inline std::optional<std::string> failure_of(transport::Request& request) {
  try {
    request.test();
    return std::nullopt;
  } catch (const Error& e) {
    return std::string(e.what());
  }
}

}  // namespace dlop::offload
