// RAII owners of the UCX context and worker: one of each per engine.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/store.hpp"

namespace dlop::transport {

// Sends of fewer bytes to a peer on another host go eagerly: UCX pushes them
// without waiting for the receiver (Endpoints::send asks for fast completion
// there, and UcxWorker sets UCX's threshold for such sends to this). Over TCP a
// rendezvous costs a round trip per message, and on a busy link its control
// messages queue behind the data sent before them. Larger sends keep the
// rendezvous, so an early sender never parks more than this at a receiver
// per message.
inline constexpr std::size_t kRemoteEagerBytes = std::size_t{2} << 20;

// UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE unless the environment has
// either (ucx_worker.cpp says why): one ring chunk per segment.
inline constexpr const char* kTcpSegmentSize = "256k";

// Throws dlop::Error(kTransport) naming the call and UCX's status string.
void check_ucs(ucs_status_t status, const char* what);

class UcxWorker {
 public:
  struct Options {
    // Ask for UCP_FEATURE_WAKEUP so that wait_for_events() can sleep on an
    // event fd. Transports without wake-up support are then left out.
    bool wakeup = true;
    // UCX settings for this context only (name without "UCX_", value), as
    // ucp_config_modify takes them, applied after dlop's own (ucx_worker.cpp:
    // the eager threshold above); a UCX_<name> in the environment wins over
    // both. Only ucp context settings: UCX 1.13 does not apply a transport's
    // (TCP_..., POSIX_...) given this way, it warns on stdout.
    std::vector<std::pair<std::string, std::string>> ucx_config;
  };

  UcxWorker();
  explicit UcxWorker(const Options& options);
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_context_h context() const { return context_.get(); }
  ucp_worker_h get() const { return worker_.get(); }
  // This worker's address, to be published through the bootstrap.
  Bytes address() const;

  // One progress pass; true if UCX did anything (call again while it does).
  bool progress();
  // Sleeps on the worker's event fd until something happens or the timeout
  // passes. Returns at once if there are events to progress. Without wake-up
  // support it just progresses once.
  void wait_for_events(std::chrono::milliseconds timeout);
  bool can_sleep() const { return event_fd_ >= 0; }
  int event_fd() const { return event_fd_; }
  // Arms the event fd; false (and nothing armed) if events are waiting to be progressed.
  bool arm();
  // Never destroys the worker and context (see Mesh::disconnect): for
  // teardown after endpoints that could not be closed.
  void abandon();

 private:
  struct ContextDeleter { void operator()(ucp_context*) const; };
  struct WorkerDeleter { void operator()(ucp_worker*) const; };

  // Makes the context and the worker; the worker's status (the context's failures throw).
  ucs_status_t open(const Options& options);

  std::unique_ptr<ucp_context, ContextDeleter> context_;
  std::unique_ptr<ucp_worker, WorkerDeleter> worker_;
  int event_fd_ = -1;
};

}  // namespace dlop::transport
