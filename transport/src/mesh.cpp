// Mesh set-up, tear-down and the detection of dead peers.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"
#include "mesh_peer.hpp"

namespace dlop::transport {
namespace {

using Clock = std::chrono::steady_clock;

// What each rank publishes about itself during wire-up.
struct WireHeader {
  std::uint32_t magic;
  std::int32_t pid;
  std::uint64_t start_time;
  std::uint32_t host_bytes;
  std::uint32_t address_bytes;
};
constexpr std::uint32_t kWireMagic = 0x444c4d31;  // "DLM1"

Bytes encode_self(const Bytes& address, const std::string& host) {
  const ProcessId self = ProcessId::self();
  const WireHeader header{kWireMagic, self.pid, self.start_time, static_cast<std::uint32_t>(host.size()),
                          static_cast<std::uint32_t>(address.size())};
  Bytes bytes(sizeof(header) + host.size() + address.size());
  std::memcpy(bytes.data(), &header, sizeof(header));
  std::memcpy(bytes.data() + sizeof(header), host.data(), host.size());
  std::memcpy(bytes.data() + sizeof(header) + host.size(), address.data(), address.size());
  return bytes;
}

Bytes decode_peer(const Bytes& bytes, int rank, ProcessId& process, std::string& host) {
  WireHeader header{};
  if (bytes.size() >= sizeof(header)) std::memcpy(&header, bytes.data(), sizeof(header));
  if (bytes.size() < sizeof(header) || header.magic != kWireMagic ||
      bytes.size() != sizeof(header) + header.host_bytes + header.address_bytes) {
    throw_error(Errc::kProtocol, fmt::format("mesh wire-up: malformed record from rank {}", rank));
  }
  process = ProcessId{header.pid, header.start_time};
  const auto* host_begin = reinterpret_cast<const char*>(bytes.data() + sizeof(header));
  host.assign(host_begin, header.host_bytes);
  const auto address_begin = bytes.begin() + static_cast<std::ptrdiff_t>(sizeof(header) + header.host_bytes);
  return Bytes(address_begin, bytes.end());
}

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

Mesh::Mesh(UcxWorker& worker, Bootstrap& bootstrap) : Mesh(worker, bootstrap, Options{}) {}

Mesh::Mesh(UcxWorker& worker, Bootstrap& bootstrap, const Options& options)
    : worker_(worker), options_(options), rank_(bootstrap.rank()), peers_(static_cast<std::size_t>(bootstrap.size())) {
  if (bootstrap.size() > (1 << (64 - kRankShift))) {
    throw_error(Errc::kInvalidArgument, fmt::format("mesh of {} ranks exceeds the tag layout", bootstrap.size()));
  }
  pending_.prev = pending_.next = &pending_;
  connect(bootstrap.allgather(encode_self(worker_.address(), options_.host), options_.timeout));
  next_check_ = Clock::now() + options_.watchdog;
}

Mesh::~Mesh() { disconnect(); }

void Mesh::connect(const std::vector<Bytes>& records) {
  for (int rank = 0; rank < size(); ++rank) {
    Peer& peer = peers_[static_cast<std::size_t>(rank)];
    peer.mesh = this;
    peer.rank = rank;
    const Bytes address = decode_peer(records[static_cast<std::size_t>(rank)], rank, peer.process, peer.host);
    peer.local = peer.host == options_.host;

    ucp_ep_params_t params{};
    params.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    // Peer mode costs shared memory (reference/ucx.md): only across hosts.
    params.err_mode = peer.local ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    // Installed in mode none too: without a handler, UCX 1.13 aborts the
    // process when a single-copy (cma) read from a dead peer fails.
    params.err_handler.cb = &Mesh::on_ep_error;
    params.err_handler.arg = &peer;
    check_ucs(ucp_ep_create(worker_.get(), &params, &peer.ep), "ucp_ep_create");
    if (log().should_log(spdlog::level::info)) {
      log().info("rank {} -> {} ({}, error mode {}):\n{}", rank_, rank, peer.local ? "same host" : "other host",
                 peer.local ? "none" : "peer", endpoint_info(peer.ep));
    }
  }
}

void Mesh::disconnect() {
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
  // ranks may be gone or never answer: a flush would wait for acknowledgements
  // that never come, and UCX cannot cancel a send. Endpoints in peer error
  // mode are then force-closed, which purges their requests.
  const bool job_broken = abandoned || std::any_of(peers_.begin(), peers_.end(),
                                                   [](const Peer& p) { return p.failure.has_value(); });
  std::vector<void*> closing;
  for (Peer& peer : peers_) {
    if (peer.ep == nullptr) continue;
    ucp_request_param_t params{};
    if (peer.failure && peer.local) continue;  // mode none: the worker's destruction releases it
    if (job_broken && !peer.local) {
      params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      params.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    const ucs_status_ptr_t request = ucp_ep_close_nbx(peer.ep, &params);
    if (UCS_PTR_IS_PTR(request)) closing.push_back(request);
    peer.ep = nullptr;
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
    log().debug("rank {}: {}; the UCX worker is left behind", rank_,
                unfinished ? "an endpoint close did not finish in time" : "sends were abandoned");
    worker_.abandon();
  }
}

std::string Mesh::describe(int peer) const {
  if (peer < 0) return "any rank";
  const Peer& p = peers_.at(static_cast<std::size_t>(peer));
  return fmt::format("rank {} (pid {} on {})", peer, p.process.pid,
                     p.local ? std::string("this host") : "host " + p.host);
}

int Mesh::check_peers() {
  next_check_ = Clock::now() + options_.watchdog;
  int found = 0;
  bool drained = false;
  for (const Peer& peer : peers_) {
    if (peer.local && !peer.failure && peer.rank != rank_ && !peer.process.alive()) {
      // Its last messages may still sit unread in shared memory (a peer that
      // finished and exited): deliver them before failing what is left.
      while (!drained && worker_.progress()) {
      }
      drained = true;
      mark_dead(peer.rank, fmt::format("its process {} exited", peer.process.pid));
      ++found;
    }
  }
  return found;
}

bool Mesh::progress() {
  const bool any = worker_.progress();
  if ((++progress_calls_ & 255u) == 0 && Clock::now() >= next_check_) check_peers();
  return any;
}

void Mesh::wait_for_events(std::chrono::milliseconds timeout) {
  if (Clock::now() >= next_check_) check_peers();
  worker_.wait_for_events(std::min(timeout, options_.watchdog));
}

std::vector<int> Mesh::pending_peers() const {
  std::vector<bool> pending(peers_.size(), false);
  for (const detail::RequestSlot* slot = pending_.next; slot != &pending_; slot = slot->next) {
    if (slot->peer >= 0) pending[static_cast<std::size_t>(slot->peer)] = true;
  }
  std::vector<int> ranks;
  for (std::size_t r = 0; r < pending.size(); ++r) {
    if (pending[r]) ranks.push_back(static_cast<int>(r));
  }
  return ranks;
}

int Mesh::event_fd() const { return worker_.event_fd(); }

bool Mesh::arm() { return worker_.arm(); }

void Mesh::mark_dead(int peer, const std::string& reason) {
  Peer& p = peers_.at(static_cast<std::size_t>(peer));
  if (p.failure) return;
  p.failure = reason;
  ++dead_peers_;
  log().warn("rank {}: {} is dead: {}", rank_, describe(peer), reason);
  for (detail::RequestSlot* slot = pending_.next; slot != &pending_;) {
    detail::RequestSlot* next = slot->next;
    if (slot->peer == peer) {
      slot->status = UCS_ERR_CONNECTION_RESET;
      slot->peer_failed = true;
      unlink(slot);
      if (slot->kind == detail::OpKind::kRecv) ucp_request_cancel(worker_.get(), slot);
    }
    slot = next;
  }
}

void Mesh::on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->mesh->mark_dead(peer->rank, fmt::format("UCX reported {}", ucs_status_string(status)));
}

void Mesh::link(detail::RequestSlot* slot) {
  slot->listed = true;
  slot->prev = pending_.prev;
  slot->next = &pending_;
  pending_.prev->next = slot;
  pending_.prev = slot;
}

void Mesh::unlink(detail::RequestSlot* slot) {
  if (!slot->listed) return;
  slot->prev->next = slot->next;
  slot->next->prev = slot->prev;
  slot->listed = false;
}

}  // namespace dlop::transport
