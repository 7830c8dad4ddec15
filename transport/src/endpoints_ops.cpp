// Endpoints: posting tagged operations and flushes, and their completion.
#include "core/error.hpp"
#include "transport/endpoints.hpp"

namespace dlop::transport {

using detail::OpKind;
using detail::RequestSlot;

void Endpoints::complete(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info) {
  auto* slot = static_cast<RequestSlot*>(request);
  slot->ucx_done = true;
  if (slot->status == UCS_INPROGRESS) {  // else dlop failed it already (dead peer)
    slot->status = status;
    if (info != nullptr && status == UCS_OK) {
      slot->received = info->length;
      slot->sender_tag = info->sender_tag;
    }
  }
  unlink(slot);
  if (slot->orphaned) RequestSlot::reset(slot);
}

void Endpoints::on_send_done(void* request, ucs_status_t status, void* /*user_data*/) {
  complete(request, status, nullptr);
}

void Endpoints::on_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                             void* /*user_data*/) {
  complete(request, status, info);
}

Request Endpoints::post_result(ucs_status_ptr_t result, OpKind kind, Peer peer, std::size_t bytes) {
  if (!UCS_PTR_IS_PTR(result)) return Request(this, kind, peer, bytes, UCS_PTR_STATUS(result));
  auto* slot = static_cast<RequestSlot*>(result);
  slot->kind = kind;
  slot->peer = peer;
  slot->bytes = bytes;
  if (!slot->ucx_done) link(slot);  // UCX may have completed it already
  return Request(this, slot);
}

Endpoints::PeerState* Endpoints::usable(Peer peer, OpKind kind, std::size_t bytes, std::optional<Request>& failed) {
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size()) {
    throw_error(Errc::kInvalidArgument, fmt::format("peer {} is not one of the {} endpoints", peer, peers_.size()));
  }
  PeerState& p = *peers_[static_cast<std::size_t>(peer)];
  if (p.failure) {
    failed.emplace(Request(this, kind, peer, bytes, UCS_ERR_CONNECTION_RESET));
    failed->inline_.peer_failed = true;
  }
  return &p;
}

Request Endpoints::send(Peer peer, const void* buffer, std::size_t bytes, std::uint64_t tag) {
  std::optional<Request> failed;
  PeerState* p = usable(peer, OpKind::kSend, bytes, failed);
  if (failed) return std::move(*failed);
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  // To another host, below kRemoteEagerBytes: eager, no rendezvous (ucx_worker.hpp).
  // Same host: shared memory's rendezvous is a single copy (cma), kept.
  if (!p->same_host) params.op_attr_mask |= UCP_OP_ATTR_FLAG_FAST_CMPL;
  params.cb.send = &Endpoints::on_send_done;
  return post_result(ucp_tag_send_nbx(p->ep, buffer, bytes, tag, &params), OpKind::kSend, peer, bytes);
}

Request Endpoints::recv(Peer peer, void* buffer, std::size_t bytes, std::uint64_t tag, std::uint64_t mask) {
  if (peer >= 0) {
    std::optional<Request> failed;
    usable(peer, OpKind::kRecv, bytes, failed);
    if (failed) return std::move(*failed);
  }
  ucp_request_param_t params{};
  // Receives never complete inline: UCX 1.13 leaves recv_info unset when a
  // receive matches an unexpected message at once, losing the sender's tag
  // and length.
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  params.cb.recv = &Endpoints::on_recv_done;
  return post_result(ucp_tag_recv_nbx(worker_.get(), buffer, bytes, tag, mask, &params), OpKind::kRecv, peer, bytes);
}

bool Endpoints::arrived(std::uint64_t tag, std::uint64_t mask) {
  ucp_tag_recv_info_t info{};
  return ucp_tag_probe_nb(worker_.get(), tag, mask, 0, &info) != nullptr;
}

Request Endpoints::flush(Peer peer) {
  std::optional<Request> failed;
  PeerState* p = usable(peer, OpKind::kFlush, 0, failed);
  if (failed) return std::move(*failed);
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  params.cb.send = &Endpoints::on_send_done;
  return post_result(ucp_ep_flush_nbx(p->ep, &params), OpKind::kFlush, peer, 0);
}

}  // namespace dlop::transport
