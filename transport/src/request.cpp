#include "transport/request.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/wait_policy.hpp"
#include "transport/endpoints.hpp"
#include "transport/mesh.hpp"

namespace dlop::transport {
namespace {

using Clock = std::chrono::steady_clock;

const char* op_name(detail::OpKind kind) {
  switch (kind) {
    case detail::OpKind::kSend: return "send";
    case detail::OpKind::kRecv: return "recv";
    case detail::OpKind::kFlush: return "flush";
  }
  return "operation";
}

}  // namespace

Request::Request(Endpoints* owner, detail::OpKind kind, int peer, std::size_t bytes, ucs_status_t status)
    : owner_(owner) {
  inline_.status = status;
  inline_.kind = kind;
  inline_.peer = peer;
  inline_.bytes = bytes;
  if (kind == detail::OpKind::kRecv) inline_.received = 0;
}

Request::Request(Endpoints* owner, detail::RequestSlot* slot) : owner_(owner), slot_(slot) {}

Request::Request(Request&& other) noexcept : owner_(other.owner_), slot_(other.slot_), inline_(other.inline_) {
  other.slot_ = nullptr;
}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = other.owner_;
    slot_ = other.slot_;
    inline_ = other.inline_;
    other.slot_ = nullptr;
  }
  return *this;
}

Request::~Request() { release(); }

void Request::release() {
  if (slot_ == nullptr) return;
  if (!slot_->ucx_done) {
    Endpoints::unlink(slot_);
    // A receive must not land in a buffer its owner may free now.
    if (slot_->kind == detail::OpKind::kRecv) {
      ucp_request_cancel(owner_->worker_.get(), slot_);
    } else if (slot_->kind == detail::OpKind::kSend) {
      settle_abandoned_send();
    } else {
      owner_->sends_abandoned_ = true;
    }
  }
  if (slot_->ucx_done) {
    detail::RequestSlot::reset(slot_);
  } else {
    slot_->orphaned = true;  // the completion callback cleans up
  }
  ucp_request_free(slot_);
  slot_ = nullptr;
}

// A send to another host goes eagerly (ucx_worker.hpp), so UCX reads its
// buffer whenever the connection is up and the socket has room, which may be
// after the owner, having dropped this request, frees the buffer. So finish it
// here (a bounded while, as close_all does), and where it does not finish (a
// peer that does not read, or a rendezvous nobody matches), drop it with a
// forced close of that endpoint (peer error mode), which purges it without
// reading. A send to this host keeps the old way: left to UCX.
void Request::settle_abandoned_send() {
  Endpoints& e = *owner_;
  const int peer = slot_->peer;
  const auto* p = peer >= 0 && static_cast<std::size_t>(peer) < e.peers_.size()
                      ? e.peers_[static_cast<std::size_t>(peer)].get()
                      : nullptr;
  if (p == nullptr || p->same_host || p->ep == nullptr) {
    e.sends_abandoned_ = true;
    return;
  }
  const auto deadline = Clock::now() + std::min(e.options_.timeout, std::chrono::milliseconds(2000));
  while (!p->failure && !slot_->ucx_done && Clock::now() < deadline) e.worker_.progress();
  if (slot_->ucx_done) return;
  e.sends_abandoned_ = true;
  e.close(peer, "a send to it was dropped unfinished");
}

bool Request::test() {
  if (state().status == UCS_INPROGRESS) owner_->progress();
  const ucs_status_t status = state().status;
  if (status == UCS_INPROGRESS) return false;
  if (status != UCS_OK) throw_failure();
  return true;
}

void Request::wait() { wait(owner_ != nullptr ? owner_->options().timeout : std::chrono::milliseconds(0)); }

bool Request::done() const { return state().status != UCS_INPROGRESS; }

void Request::wait(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kMaxBlock{10};
  if (test()) return;
  const auto& options = owner_->options();
  const auto deadline = Clock::now() + timeout;
  Waiter waiter(options.progress, options.spin);
  for (unsigned round = 1;; ++round) {
    if (test()) return;
    const bool polling = waiter.pause();
    // Read the clock only every few rounds; and after a block, progress a few
    // times before the next: some UCX steps (a wire-up's next message) need
    // progress but signal no event.
    if ((round & 15u) != 0) continue;
    const auto now = Clock::now();
    if (now >= deadline) {
      const auto& s = state();
      const auto& failure = s.peer >= 0 ? owner_->failure(s.peer) : std::nullopt;
      throw_error(Errc::kTimeout,
                  fmt::format("{} of {} B {} {} timed out after {} ms{}", op_name(s.kind), s.bytes,
                              s.kind == detail::OpKind::kRecv ? "from" : "to", owner_->describe(s.peer),
                              timeout.count(), failure ? "; peer dead: " + *failure : "; peer alive"));
    }
    // Bounded for the same reason.
    if (!polling) owner_->wait_for_events(std::min(kMaxBlock, std::chrono::ceil<std::chrono::milliseconds>(deadline - now)));
  }
}

void Request::cancel() {
  if (slot_ != nullptr && slot_->status == UCS_INPROGRESS) ucp_request_cancel(owner_->worker_.get(), slot_);
}

std::size_t Request::received_bytes() const { return state().received; }

int Request::source() const {
  const auto& s = state();
  return s.peer >= 0 ? s.peer : static_cast<int>(s.sender_tag >> kUserTagBits);
}

void Request::throw_failure() const {
  const auto& s = state();
  const std::string what = fmt::format("{} of {} B {} {}", op_name(s.kind), s.bytes,
                                       s.kind == detail::OpKind::kRecv ? "from" : "to", owner_->describe(s.peer));
  const auto* failure = s.peer >= 0 && owner_->failure(s.peer) ? &*owner_->failure(s.peer) : nullptr;
  if (s.peer_failed || failure != nullptr) {
    throw_error(Errc::kPeerDead, fmt::format("{} failed: the peer died ({})", what,
                                             failure != nullptr ? *failure : ucs_status_string(s.status)));
  }
  if (s.status == UCS_ERR_CANCELED) throw_error(Errc::kCanceled, what + " was canceled");
  if (s.status == UCS_ERR_MESSAGE_TRUNCATED) {
    throw_error(Errc::kProtocol, fmt::format("{}: the message was longer than the buffer", what));
  }
  throw_error(Errc::kTransport, fmt::format("{} failed: {}", what, ucs_status_string(s.status)));
}

}  // namespace dlop::transport
