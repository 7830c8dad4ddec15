// The state dlop keeps inside every UCX request (ucp_params.request_size), so
// posting an operation allocates nothing beyond UCX's own request pool.
//
// A slot is reset when UCX creates the request and again before the request
// goes back to UCX's pool, because UCX may run the completion callback before
// the posting call returns.
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>

namespace dlop::transport::detail {

enum class OpKind : std::uint8_t { kSend, kRecv, kFlush };

struct RequestSlot {
  // Links in the Endpoints' list of pending requests; unlinked on completion.
  RequestSlot* prev = nullptr;
  RequestSlot* next = nullptr;
  ucs_status_t status = UCS_INPROGRESS;  // dlop's view: UCX's result, or a dead peer
  bool ucx_done = false;     // UCX ran the completion callback
  bool listed = false;
  bool peer_failed = false;  // failed by dlop because its peer died
  bool orphaned = false;     // its Request was released before UCX finished
  OpKind kind = OpKind::kSend;
  int peer = -1;             // -1 for a receive from any source
  std::size_t bytes = 0;     // requested length
  std::size_t received = 0;  // receives: actual length
  ucp_tag_t sender_tag = 0;  // receives: the tag that matched

  static void reset(void* request) { *static_cast<RequestSlot*>(request) = RequestSlot{}; }
};

}  // namespace dlop::transport::detail
