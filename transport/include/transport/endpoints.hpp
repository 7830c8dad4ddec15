// Endpoints: UCX endpoints on one worker, made from peers' worker addresses,
// and the tagged operations on them as Requests. Mesh and offload's daemon
// and client all reach UCX through this class.
//
// What it settles once for all its users:
// - error mode by host: a peer on this host gets mode NONE, so UCX keeps
//   shared memory and cma (peer mode would force TCP over loopback); a peer
//   on another host gets peer mode, so UCX reports its failure;
// - an error callback on every endpoint (also in mode NONE: without one UCX
//   1.13 aborts the process when a cma read from a just-dead peer fails),
//   which fails every request toward that peer with kPeerDead;
// - bounded close: flush-close with a deadline, force-close after failures,
//   and the UCX 1.13 quirk that a worker destroyed under an endpoint that
//   still closes or holds a send aborts the process (the worker is then
//   abandoned instead: a leak after a failure rather than a crash).
//
// Driven by one thread at a time, like its worker.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "transport/request.hpp"
#include "transport/store.hpp"
#include "transport/ucx_worker.hpp"

namespace dlop::transport {

class Endpoints {
 public:
  struct Options {
    std::chrono::milliseconds timeout = config().timeout;  // Request::wait()'s default
    ProgressMode progress = config().progress;  // kAuto: the process's WaitPolicy (core/wait_policy.hpp)
    std::chrono::microseconds spin = config().spin;  // the longest a spinning wait polls before it blocks
  };
  using Peer = int;  // an index given by connect(), from 0 up, never reused

  Endpoints(UcxWorker& worker, const Options& options);
  // Closes what is still open (close_all()).
  ~Endpoints();
  Endpoints(const Endpoints&) = delete;
  Endpoints& operator=(const Endpoints&) = delete;

  // An endpoint to the worker at `address`; `same_host` picks the error mode
  // (see above). `name` names the peer in error messages. Throws
  // kTransport when UCX refuses the address.
  Peer connect(const Bytes& address, bool same_host, std::string name);
  // Closes one endpoint at once (force: pending sends fail), e.g. when its
  // peer hung up; its requests fail with kPeerDead, later ones at once.
  void close(Peer peer, const std::string& why);
  // Cancels receives and closes every endpoint with a bounded wait (see above).
  void close_all();

  Request send(Peer peer, const void* buffer, std::size_t bytes, std::uint64_t tag);
  // A receive matching (sender tag & mask) == tag. `peer` says whom it is
  // from for errors and dead-peer failure; -1 for any sender (or when the
  // sender has no endpoint here, as for a client that only receives).
  Request recv(Peer peer, void* buffer, std::size_t bytes, std::uint64_t tag, std::uint64_t mask);
  // Whether a message matching (tag & mask) waits for a receive (for a large
  // one, only its announcement: its data moves once the receive is posted).
  // Leaves it there; progress() brings messages in.
  bool arrived(std::uint64_t tag, std::uint64_t mask);
  // Completes once the earlier operations on the endpoint are done at the
  // peer, which also proves the connection is up.
  Request flush(Peer peer);

  bool progress();
  // Sleeps until UCX has events, at most `timeout`.
  void wait_for_events(std::chrono::milliseconds timeout);
  // Runs `check` from progress() every `interval` (checked every 256 calls)
  // and before sleeping: a liveness watchdog (Mesh's).
  void set_liveness_check(std::function<void()> check, std::chrono::milliseconds interval);

  // Fails every request toward `peer` with kPeerDead and later ones at once.
  void mark_dead(Peer peer, const std::string& reason);
  const std::optional<std::string>& failure(Peer peer) const { return peer_at(peer).failure; }
  std::size_t dead_peers() const { return dead_peers_; }
  const std::string& name(Peer peer) const { return peer_at(peer).name; }
  std::string describe(Peer peer) const { return peer < 0 ? any_name_ : name(peer); }
  // How a receive from any sender is named in errors.
  void set_any_name(std::string name) { any_name_ = std::move(name); }
  std::size_t size() const { return peers_.size(); }
  // Peers that requests are pending toward (ascending, no duplicates).
  std::vector<int> pending_peers() const;
  const Options& options() const { return options_; }
  UcxWorker& worker() { return worker_; }

 private:
  friend class Request;
  struct PeerState {
    Endpoints* owner = nullptr;
    Peer index = 0;
    std::string name;
    bool same_host = false;
    ucp_ep_h ep = nullptr;
    std::optional<std::string> failure;
  };

  const PeerState& peer_at(Peer peer) const;
  PeerState* usable(Peer peer, detail::OpKind kind, std::size_t bytes, std::optional<Request>& failed);
  Request post_result(ucs_status_ptr_t result, detail::OpKind kind, Peer peer, std::size_t bytes);
  void fail_requests(Peer peer);
  void link(detail::RequestSlot* slot);
  static void unlink(detail::RequestSlot* slot);
  static void complete(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info);
  static void on_send_done(void* request, ucs_status_t status, void* user_data);
  static void on_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  UcxWorker& worker_;
  Options options_;
  std::vector<std::unique_ptr<PeerState>> peers_;
  std::size_t dead_peers_ = 0;
  std::string any_name_ = "any peer";
  detail::RequestSlot pending_;  // sentinel of the list of pending requests
  std::function<void()> liveness_check_;
  std::chrono::milliseconds check_interval_{0};
  std::chrono::steady_clock::time_point next_check_ = std::chrono::steady_clock::time_point::max();
  unsigned progress_calls_ = 0;
  // A send was dropped while UCX still held it (an operation that failed or
  // timed out): see close_all().
  bool sends_abandoned_ = false;
  bool closed_ = false;
};

}  // namespace dlop::transport
