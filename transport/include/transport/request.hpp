// A handle to one non-blocking transport operation.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "transport/detail/request_slot.hpp"

namespace dlop::transport {

class Endpoints;

class Request {
 public:
  Request() = default;  // an empty request is complete
  Request(Request&& other) noexcept;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  // Releasing a pending request abandons it: UCX finishes or drops it later,
  // except a send to another host, settled before this returns (request.cpp),
  // so its buffer may be freed after.
  ~Request();

  // Progresses the endpoints' worker once. True when complete; throws
  // dlop::Error if failed.
  bool test();
  // Whether it finished (either way), without progressing anything.
  bool done() const;
  // Whether UCX has let go of the buffer: a request failed early by a dead
  // or closed peer may still be held by UCX until the close purges it.
  bool released_by_ucx() const { return slot_ == nullptr || slot_->ucx_done; }
  // Progresses until complete; throws kTimeout (naming the operation and peer),
  // kPeerDead, kCanceled or kTransport.
  void wait(std::chrono::milliseconds timeout);
  void wait();  // with the endpoints' default timeout
  // Asks UCX to cancel a pending receive; wait() then throws kCanceled.
  void cancel();

  // For receives: the length that arrived and the peer that sent it (for a
  // receive from any peer, the rank in a Mesh tag's top bits).
  std::size_t received_bytes() const;
  int source() const;

 private:
  friend class Endpoints;
  // A request that completed at once, or failed before posting.
  Request(Endpoints* owner, detail::OpKind kind, int peer, std::size_t bytes, ucs_status_t status);
  // A pending UCX request: slot lives inside it.
  Request(Endpoints* owner, detail::RequestSlot* slot);

  const detail::RequestSlot& state() const { return slot_ != nullptr ? *slot_ : inline_; }
  void release();
  void settle_abandoned_send();  // from release(), for a send UCX still holds
  [[noreturn]] void throw_failure() const;

  Endpoints* owner_ = nullptr;
  detail::RequestSlot* slot_ = nullptr;
  detail::RequestSlot inline_{.status = UCS_OK};
};

}  // namespace dlop::transport
