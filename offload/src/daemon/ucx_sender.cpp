#include "ucx_sender.hpp"

#include <algorithm>
#include <chrono>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dlop::offload::daemon {

namespace {

// The sender's side of the put rendezvous that OffloadClient::make_worker
// asks for: UCX 1.13 chooses the scheme where the send starts, so the daemon
// needs it too for the batch to be written into the trainer's buffer.
transport::UcxWorker::Options sender_options() {
  transport::UcxWorker::Options o;
  o.ucx_config = {{"RNDV_SCHEME", "put_zcopy"}};
  return o;
}

}  // namespace

UcxSender::UcxSender() : worker_(sender_options()) {}

UcxSender::~UcxSender() {
  for (auto& [id, e] : endpoints_) close_ep(e->ep);
  endpoints_.clear();
  // Give UCX a moment to fail the pending sends and finish the closes; their
  // buffers belong to the executor, which outlives nothing here.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  const auto pending = [this] {
    return !closing_.empty() || std::any_of(finished_.begin(), finished_.end(),
                                            [](const auto& op) { return op->status == UCS_INPROGRESS; });
  };
  while (pending() && std::chrono::steady_clock::now() < deadline) progress();
  for (void* r : closing_) ucp_request_free(r);
  // A send UCX never finished may still call back into its op: leak it rather
  // than let UCX write into freed memory while the worker is destroyed.
  for (auto& op : finished_) {
    if (op->status == UCS_INPROGRESS) (void)op.release();
  }
}

UcxSender::EndpointId UcxSender::connect(const protocol::Bytes& worker_address, const std::string& peer,
                                         bool same_host) {
  auto e = std::make_unique<Endpoint>();
  e->id = next_id_++;
  e->peer = peer;
  ucp_ep_params_t params{};
  params.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  // On one host, mode NONE keeps shared memory: with the put rendezvous this
  // daemon writes the batch into the trainer's buffer by cma and the
  // trainer's cores copy nothing. Peer mode would force loopback TCP, whose
  // receive copies on the trainer. A dead client still fails the send through
  // the error handler; a dead daemon is seen by the client on the control
  // connection.
  params.err_mode = same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxSender::on_ep_error;
  // UCX 1.13 may call the handler even after a forced close has completed,
  // so it gets the sender (which outlives its worker) and looks the endpoint up.
  params.err_handler.arg = this;
  // UCX parses the address we were given; it came from an authenticated
  // client, but a garbled one must still only fail this connection.
  transport::check_ucs(ucp_ep_create(worker_.get(), &params, &e->ep), "ucp_ep_create (client's worker address)");
  connecting_ = e.get();
  try {
    wire_up(*e);
  } catch (...) {
    connecting_ = nullptr;
    throw;
  }
  connecting_ = nullptr;
  const EndpointId id = e->id;
  endpoints_.emplace(id, std::move(e));
  return id;
}

// Completes the connection before the client hears CONFIGURED. UCX 1.13
// aborts the client's process (an assertion in its request purge) when the
// daemon dies while the client's wire-up reply to it is still queued; once
// this flush has completed, that reply has arrived, so a daemon killed later
// only fails the client's endpoint, as it should.
void UcxSender::wire_up(Endpoint& e) {
  ucp_request_param_t params{};
  const ucs_status_ptr_t r = ucp_ep_flush_nbx(e.ep, &params);
  ucs_status_t status = UCS_PTR_STATUS(r);
  if (UCS_PTR_IS_PTR(r)) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((status = ucp_request_check_status(r)) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_.get());
    }
    ucp_request_free(r);  // one still in progress is released by UCX when the close below purges it
  }
  if (status != UCS_OK || !e.failure.empty()) {
    close_ep(e.ep);
    throw_error(Errc::kTransport, "UCX connection to " + e.peer + " did not come up: " +
                                      (e.failure.empty() ? std::string(ucs_status_string(status)) : e.failure));
  }
}

void UcxSender::close_ep(ucp_ep_h ep) {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  const ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &params);
  if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
}

void UcxSender::disconnect(EndpointId id) {
  const auto it = endpoints_.find(id);
  if (it == endpoints_.end()) return;
  close_ep(it->second->ep);
  endpoints_.erase(it);
}

void UcxSender::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxSender*>(arg);
  for (auto& [id, e] : self->endpoints_) {
    if (e->ep != ep) continue;
    e->failure = ucs_status_string(status);
    log().warn("offloader: UCX endpoint to {} failed: {}", e->peer, e->failure);
    return;
  }
  if (self->connecting_ != nullptr && self->connecting_->ep == ep) {
    self->connecting_->failure = ucs_status_string(status);
    return;
  }
  log().debug("offloader: a closed UCX endpoint reported: {}", ucs_status_string(status));
}

void UcxSender::on_send(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<SendOp*>(user_data);
  op->status = status;
  ucp_request_free(request);
}

void UcxSender::send(EndpointId id, const void* data, std::size_t bytes, std::uint64_t tag, Done done) {
  auto op = std::make_unique<SendOp>();
  op->done = std::move(done);
  const auto it = endpoints_.find(id);
  if (it == endpoints_.end() || !it->second->failure.empty()) {
    op->status = UCS_ERR_CONNECTION_RESET;
    finished_.push_back(std::move(op));
    return;
  }
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  params.cb.send = &UcxSender::on_send;
  params.user_data = op.get();
  const ucs_status_ptr_t r = ucp_tag_send_nbx(it->second->ep, data, bytes, tag, &params);
  if (!UCS_PTR_IS_PTR(r)) op->status = UCS_PTR_STATUS(r);  // done at once, or failed
  // Pending ops wait in finished_ as well; progress() runs those whose status is set.
  finished_.push_back(std::move(op));
}

bool UcxSender::progress() {
  bool any = false;
  while (ucp_worker_progress(worker_.get()) != 0) any = true;
  // Run the callbacks of completed sends (outside UCX's callback, so they may
  // post new sends or close endpoints).
  std::vector<std::unique_ptr<SendOp>> ready;
  std::erase_if(finished_, [&](std::unique_ptr<SendOp>& op) {
    if (op->status == UCS_INPROGRESS) return false;
    ready.push_back(std::move(op));
    return true;
  });
  for (auto& op : ready) op->done(op->status);
  std::erase_if(closing_, [](void* r) {
    if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
    ucp_request_free(r);
    return true;
  });
  return any || !ready.empty();
}

}  // namespace dlop::offload::daemon
