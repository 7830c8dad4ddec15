// Endpoints: creation, bounded close, dead peers and the pending list.
// Posting operations is in endpoints_ops.cpp.
#include "transport/endpoints.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dlop::transport {
namespace {

using Clock = std::chrono::steady_clock;

std::string endpoint_info(ucp_ep_h ep) {
  char* text = nullptr;
  std::size_t length = 0;
  FILE* stream = ::open_memstream(&text, &length);
  if (stream == nullptr) return "?";
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  std::string info(text, length);
  std::free(text);
  return info;
}

}  // namespace

Endpoints::Endpoints(UcxWorker& worker, const Options& options) : worker_(worker), options_(options) {
  pending_.prev = pending_.next = &pending_;
}

Endpoints::~Endpoints() { close_all(); }

const Endpoints::PeerState& Endpoints::peer_at(Peer peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= peers_.size()) {
    throw_error(Errc::kInvalidArgument, fmt::format("peer {} is not one of the {} endpoints", peer, peers_.size()));
  }
  return *peers_[static_cast<std::size_t>(peer)];
}

Endpoints::Peer Endpoints::connect(const Bytes& address, bool same_host, std::string name) {
  auto peer = std::make_unique<PeerState>();
  peer->owner = this;
  peer->index = static_cast<Peer>(peers_.size());
  peer->name = std::move(name);
  peer->same_host = same_host;
  ucp_ep_params_t params{};
  params.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  // Peer mode costs shared memory (reference/ucx.md): only across hosts.
  params.err_mode = same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  // Installed in mode none too: without a handler, UCX 1.13 aborts the
  // process when a single-copy (cma) read from a dead peer fails. The state
  // it points to lives as long as this object, closed or not, since UCX 1.13
  // may call the handler even after a forced close has completed.
  params.err_handler.cb = &Endpoints::on_ep_error;
  params.err_handler.arg = peer.get();
  check_ucs(ucp_ep_create(worker_.get(), &params, &peer->ep),
            fmt::format("ucp_ep_create (worker address of {})", peer->name).c_str());
  if (log().should_log(spdlog::level::info)) {
    log().info("endpoint to {} ({}, error mode {}):\n{}", peer->name, same_host ? "same host" : "other host",
               same_host ? "none" : "peer", endpoint_info(peer->ep));
  }
  peers_.push_back(std::move(peer));
  return peers_.back()->index;
}

void Endpoints::close(Peer index, const std::string& why) {
  PeerState& peer = *peers_.at(static_cast<std::size_t>(index));
  if (!peer.failure) {
    peer.failure = "closed: " + why;
    fail_requests(index);
  }
  if (peer.ep == nullptr) return;
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  const ucs_status_ptr_t request = ucp_ep_close_nbx(peer.ep, &params);
  peer.ep = nullptr;
  // A forced close finishes without the peer; UCX frees the request itself
  // once it is done.
  if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);
}

void Endpoints::close_all() {
  if (closed_) return;
  closed_ = true;
  // Abandoned requests may still complete later: keep their callbacks away
  // from the list, which dies with us.
  const bool abandoned = sends_abandoned_ || pending_.next != &pending_;
  bool sends_abandoned = sends_abandoned_;
  for (detail::RequestSlot* slot = pending_.next; slot != &pending_;) {
    detail::RequestSlot* next = slot->next;
    slot->listed = false;
    sends_abandoned = sends_abandoned || slot->kind != detail::OpKind::kRecv;
    if (slot->kind == detail::OpKind::kRecv) ucp_request_cancel(worker_.get(), slot);
    slot = next;
  }
  pending_.prev = pending_.next = &pending_;

  // Flush-close live endpoints; a bounded wait so a vanished peer cannot hang us.
  // Once a peer has died, or operations were abandoned (timed out), the other
  // peers may be gone or never answer: a flush would wait for acknowledgements
  // that never come, and UCX cannot cancel a send. Endpoints in peer error
  // mode are then force-closed, which purges their requests.
  const bool broken = abandoned || dead_peers_ > 0;
  std::vector<void*> closing;
  for (auto& peer : peers_) {
    if (peer->ep == nullptr) continue;
    ucp_request_param_t params{};
    if (peer->failure && peer->same_host) {  // mode none: the worker's destruction releases it
      peer->ep = nullptr;
      continue;
    }
    if (broken && !peer->same_host) {
      params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      params.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    const ucs_status_ptr_t request = ucp_ep_close_nbx(peer->ep, &params);
    if (UCS_PTR_IS_PTR(request)) closing.push_back(request);
    peer->ep = nullptr;
  }
  const auto deadline = Clock::now() + std::min(options_.timeout, std::chrono::milliseconds(2000));
  bool unfinished = false;
  for (void* request : closing) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline) worker_.progress();
    unfinished = unfinished || ucp_request_check_status(request) == UCS_INPROGRESS;
    ucp_request_free(request);
  }
  if (unfinished || sends_abandoned) {
    // UCX (1.13) aborts the process when a worker is destroyed under an
    // endpoint whose close still runs or that still holds a send (a force
    // close does not purge a rendezvous send, and a send cannot be cancelled);
    // leaking the worker at teardown is the lesser harm.
    log().debug("{}; the UCX worker is left behind",
                unfinished ? "an endpoint close did not finish in time" : "sends were abandoned");
    worker_.abandon();
  }
}

bool Endpoints::progress() {
  const bool any = worker_.progress();
  if ((++progress_calls_ & 255u) == 0 && liveness_check_ && Clock::now() >= next_check_) {
    next_check_ = Clock::now() + check_interval_;
    liveness_check_();
  }
  return any;
}

void Endpoints::wait_for_events(std::chrono::milliseconds timeout) {
  if (liveness_check_) {
    if (Clock::now() >= next_check_) {
      next_check_ = Clock::now() + check_interval_;
      liveness_check_();
    }
    timeout = std::min(timeout, check_interval_);
  }
  worker_.wait_for_events(timeout);
}

void Endpoints::set_liveness_check(std::function<void()> check, std::chrono::milliseconds interval) {
  liveness_check_ = std::move(check);
  check_interval_ = interval;
  next_check_ = Clock::now() + interval;
}

std::vector<int> Endpoints::pending_peers() const {
  std::vector<bool> pending(peers_.size(), false);
  for (const detail::RequestSlot* slot = pending_.next; slot != &pending_; slot = slot->next) {
    if (slot->peer >= 0) pending[static_cast<std::size_t>(slot->peer)] = true;
  }
  std::vector<int> peers;
  for (std::size_t r = 0; r < pending.size(); ++r) {
    if (pending[r]) peers.push_back(static_cast<int>(r));
  }
  return peers;
}

void Endpoints::mark_dead(Peer index, const std::string& reason) {
  PeerState& peer = *peers_.at(static_cast<std::size_t>(index));
  if (peer.failure) return;
  peer.failure = reason;
  ++dead_peers_;
  log().warn("{} is dead: {}", peer.name, reason);
  fail_requests(index);
}

void Endpoints::fail_requests(Peer index) {
  for (detail::RequestSlot* slot = pending_.next; slot != &pending_;) {
    detail::RequestSlot* next = slot->next;
    if (slot->peer == index) {
      slot->status = UCS_ERR_CONNECTION_RESET;
      slot->peer_failed = true;
      unlink(slot);
      if (slot->kind == detail::OpKind::kRecv) ucp_request_cancel(worker_.get(), slot);
    }
    slot = next;
  }
}

void Endpoints::on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<PeerState*>(arg);
  peer->owner->mark_dead(peer->index, fmt::format("UCX reported {}", ucs_status_string(status)));
}

void Endpoints::link(detail::RequestSlot* slot) {
  slot->listed = true;
  slot->prev = pending_.prev;
  slot->next = &pending_;
  pending_.prev->next = slot;
  pending_.prev = slot;
}

void Endpoints::unlink(detail::RequestSlot* slot) {
  if (!slot->listed) return;
  slot->prev->next = slot->next;
  slot->next->prev = slot->prev;
  slot->listed = false;
}

}  // namespace dlop::transport
