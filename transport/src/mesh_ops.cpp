// Mesh operations: tagged send/recv, active messages and puts.
#include "core/error.hpp"
#include "core/log.hpp"
#include "mesh_peer.hpp"

namespace dlop::transport {
namespace {

using detail::OpKind;
using detail::RequestSlot;

constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};

void check_tag(Tag tag) {
  if (tag > kMaxUserTag) {
    throw_error(Errc::kInvalidArgument, fmt::format("tag {:#x} exceeds the {} bits a user tag may use", tag, kUserTagBits));
  }
}

// The header of an active message: the sender's rank, then the user's header.
struct AmPending {
  const AmHandler* handler;
  std::vector<std::byte> header;
  std::vector<std::byte> data;
};

void deliver_am(const AmHandler& handler, std::span<const std::byte> header, std::span<const std::byte> data) {
  std::int32_t source = -1;
  if (header.size() < sizeof(source)) {
    log().warn("dropped an active message without a sender rank ({} header bytes)", header.size());
    return;
  }
  std::memcpy(&source, header.data(), sizeof(source));
  handler(source, header.subspan(sizeof(source)), data);
}

}  // namespace

void Mesh::complete(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info) {
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
  if (slot->orphaned) {
    delete[] slot->owned;
    RequestSlot::reset(slot);
  }
}

void Mesh::on_send_done(void* request, ucs_status_t status, void* /*user_data*/) {
  complete(request, status, nullptr);
}

void Mesh::on_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* /*user_data*/) {
  complete(request, status, info);
}

// Receives never complete inline: UCX 1.13 leaves recv_info unset when a
// receive matches an unexpected message at once, losing the sender's tag.
ucp_request_param_t Mesh::recv_params() {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  params.cb.recv = &Mesh::on_recv_done;
  return params;
}

Request Mesh::post_result(ucs_status_ptr_t result, OpKind kind, int peer, std::size_t bytes, unsigned char* owned) {
  if (!UCS_PTR_IS_PTR(result)) {
    delete[] owned;
    return Request(this, kind, peer, bytes, UCS_PTR_STATUS(result));
  }
  auto* slot = static_cast<RequestSlot*>(result);
  slot->kind = kind;
  slot->peer = peer;
  slot->bytes = bytes;
  slot->owned = owned;
  if (!slot->ucx_done) link(slot);  // UCX may have completed it already
  return Request(this, slot);
}

ucp_ep_h Mesh::endpoint_for(int peer, OpKind kind, std::size_t bytes, std::optional<Request>& failed) {
  if (peer < 0 || peer >= size()) {
    throw_error(Errc::kInvalidArgument, fmt::format("rank {} is outside the mesh of {} ranks", peer, size()));
  }
  const Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (p.failure) {
    failed.emplace(Request(this, kind, peer, bytes, UCS_ERR_CONNECTION_RESET));
    failed->inline_.peer_failed = true;
  }
  return p.ep;
}

Request Mesh::send(int peer, const void* buffer, std::size_t bytes, Tag tag) {
  check_tag(tag);
  std::optional<Request> failed;
  ucp_ep_h ep = endpoint_for(peer, OpKind::kSend, bytes, failed);
  if (failed) return std::move(*failed);
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  params.cb.send = &Mesh::on_send_done;
  const ucp_tag_t ucx_tag = (static_cast<ucp_tag_t>(rank_) << kRankShift) | tag;
  return post_result(ucp_tag_send_nbx(ep, buffer, bytes, ucx_tag, &params), OpKind::kSend, peer, bytes);
}

Request Mesh::recv(int peer, void* buffer, std::size_t bytes, Tag tag) {
  check_tag(tag);
  std::optional<Request> failed;
  endpoint_for(peer, OpKind::kRecv, bytes, failed);
  if (failed) return std::move(*failed);
  const ucp_request_param_t params = recv_params();
  const ucp_tag_t ucx_tag = (static_cast<ucp_tag_t>(peer) << kRankShift) | tag;
  return post_result(ucp_tag_recv_nbx(worker_.get(), buffer, bytes, ucx_tag, kFullMask, &params), OpKind::kRecv,
                     peer, bytes);
}

Request Mesh::recv_any(void* buffer, std::size_t bytes, Tag tag) {
  check_tag(tag);
  const ucp_request_param_t params = recv_params();
  return post_result(ucp_tag_recv_nbx(worker_.get(), buffer, bytes, tag, kUserTagMask, &params), OpKind::kRecv, -1,
                     bytes);
}

void Mesh::set_am_handler(std::uint16_t id, AmHandler handler) {
  auto context = std::make_unique<AmContext>(AmContext{this, id, std::move(handler)});
  ucp_am_handler_param_t params{};
  params.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  params.id = id;
  params.arg = context.get();
  params.cb = [](void* arg, const void* header, std::size_t header_bytes, void* data, std::size_t bytes,
                 const ucp_am_recv_param_t* param) -> ucs_status_t {
    auto* ctx = static_cast<AmContext*>(arg);
    const std::span<const std::byte> head(static_cast<const std::byte*>(header), header_bytes);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      deliver_am(ctx->handler, head, {static_cast<const std::byte*>(data), bytes});
      return UCS_OK;
    }
    // Rendezvous: fetch the payload first; the header is only valid now, so copy it.
    auto* pending = new AmPending{&ctx->handler, {head.begin(), head.end()}, std::vector<std::byte>(bytes)};
    ucp_request_param_t recv_params{};
    recv_params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    recv_params.user_data = pending;
    recv_params.cb.recv_am = [](void* request, ucs_status_t status, std::size_t, void* user_data) {
      std::unique_ptr<AmPending> done(static_cast<AmPending*>(user_data));
      if (status == UCS_OK) deliver_am(*done->handler, done->header, done->data);
      else log().warn("active message payload lost: {}", ucs_status_string(status));
      ucp_request_free(request);
    };
    const ucs_status_ptr_t result =
        ucp_am_recv_data_nbx(ctx->mesh->worker_.get(), data, pending->data.data(), bytes, &recv_params);
    if (!UCS_PTR_IS_PTR(result)) {
      std::unique_ptr<AmPending> done(pending);
      if (UCS_PTR_STATUS(result) == UCS_OK) deliver_am(*done->handler, done->header, done->data);
      else log().warn("active message payload lost: {}", ucs_status_string(UCS_PTR_STATUS(result)));
    }
    return UCS_OK;
  };
  check_ucs(ucp_worker_set_am_recv_handler(worker_.get(), &params), "ucp_worker_set_am_recv_handler");
  am_contexts_.push_back(std::move(context));
}

Request Mesh::am_send(int peer, std::uint16_t id, std::span<const std::byte> header,
                      std::span<const std::byte> payload) {
  std::optional<Request> failed;
  ucp_ep_h ep = endpoint_for(peer, OpKind::kAmSend, payload.size(), failed);
  if (failed) return std::move(*failed);
  // UCX reads the header until completion, so it lives with the request.
  const std::size_t header_bytes = sizeof(std::int32_t) + header.size();
  auto* full_header = new unsigned char[header_bytes];
  std::memcpy(full_header, &rank_, sizeof(std::int32_t));
  if (!header.empty()) std::memcpy(full_header + sizeof(std::int32_t), header.data(), header.size());
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  params.cb.send = &Mesh::on_send_done;
  return post_result(ucp_am_send_nbx(ep, id, full_header, header_bytes, payload.data(), payload.size(), &params),
                     OpKind::kAmSend, peer, payload.size(), full_header);
}

RemoteKey Mesh::unpack_key(int peer, const Bytes& packed) {
  std::optional<Request> failed;
  ucp_ep_h ep = endpoint_for(peer, OpKind::kPut, 0, failed);
  if (failed) throw_error(Errc::kPeerDead, fmt::format("cannot unpack a key of {}: {}", describe(peer), *peer_failure(peer)));
  ucp_rkey_h key = nullptr;
  check_ucs(ucp_ep_rkey_unpack(ep, packed.data(), &key), "ucp_ep_rkey_unpack");
  return RemoteKey(peer, key);
}

Request Mesh::put(int peer, const void* local, std::size_t bytes, std::uint64_t remote_address, const RemoteKey& key) {
  if (key.peer() != peer) {
    throw_error(Errc::kInvalidArgument, fmt::format("put to rank {} with a key of rank {}", peer, key.peer()));
  }
  std::optional<Request> failed;
  ucp_ep_h ep = endpoint_for(peer, OpKind::kPut, bytes, failed);
  if (failed) return std::move(*failed);
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  params.cb.send = &Mesh::on_send_done;
  return post_result(ucp_put_nbx(ep, local, bytes, remote_address, key.get(), &params), OpKind::kPut, peer, bytes);
}

Request Mesh::flush(int peer) {
  std::optional<Request> failed;
  ucp_ep_h ep = endpoint_for(peer, OpKind::kFlush, 0, failed);
  if (failed) return std::move(*failed);
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  params.cb.send = &Mesh::on_send_done;
  return post_result(ucp_ep_flush_nbx(ep, &params), OpKind::kFlush, peer, 0);
}

}  // namespace dlop::transport

namespace dlop::transport {

void Mesh::fence(std::chrono::milliseconds timeout) {
  constexpr Tag kFenceTag = kMaxUserTag + 1;
  std::vector<Request> requests;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_ || peer_failure(peer)) continue;
    std::optional<Request> failed;
    ucp_ep_h ep = endpoint_for(peer, OpKind::kSend, 0, failed);
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    params.cb.send = &Mesh::on_send_done;
    const ucp_tag_t send_tag = (static_cast<ucp_tag_t>(rank_) << kRankShift) | kFenceTag;
    requests.push_back(post_result(ucp_tag_send_nbx(ep, nullptr, 0, send_tag, &params), OpKind::kSend, peer, 0));
    const ucp_request_param_t recv = recv_params();
    const ucp_tag_t recv_tag = (static_cast<ucp_tag_t>(peer) << kRankShift) | kFenceTag;
    requests.push_back(post_result(ucp_tag_recv_nbx(worker_.get(), nullptr, 0, recv_tag, ~ucp_tag_t{0}, &recv),
                                   OpKind::kRecv, peer, 0));
  }
  for (auto& r : requests) r.wait(timeout);
}

}  // namespace dlop::transport
