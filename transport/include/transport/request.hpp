// A handle to one non-blocking transport operation.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "transport/detail/request_slot.hpp"

namespace dlop::transport {

class Mesh;

class Request {
 public:
  Request() = default;  // an empty request is complete
  Request(Request&& other) noexcept;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  // Releasing a pending request abandons it: UCX finishes or drops it later.
  ~Request();

  // Progresses the mesh once. True when complete; throws dlop::Error if failed.
  bool test();
  // Progresses until complete; throws kTimeout (naming the operation and peer),
  // kPeerDead, kCanceled or kTransport.
  void wait(std::chrono::milliseconds timeout);
  void wait();  // with the mesh's default timeout
  // Asks UCX to cancel a pending receive; wait() then throws kCanceled.
  void cancel();

  // For receives: the length that arrived and the rank that sent it.
  std::size_t received_bytes() const;
  int source() const;

 private:
  friend class Mesh;
  // A request that completed at once, or failed before posting.
  Request(Mesh* mesh, detail::OpKind kind, int peer, std::size_t bytes, ucs_status_t status);
  // A pending UCX request: slot lives inside it.
  Request(Mesh* mesh, detail::RequestSlot* slot);

  const detail::RequestSlot& state() const { return slot_ != nullptr ? *slot_ : inline_; }
  void release();
  [[noreturn]] void throw_failure() const;

  Mesh* mesh_ = nullptr;
  detail::RequestSlot* slot_ = nullptr;
  detail::RequestSlot inline_{.status = UCS_OK};
};

}  // namespace dlop::transport
