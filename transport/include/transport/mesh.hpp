// Mesh: endpoints from this process to every rank of a bootstrap group, with
// tagged send/recv, active messages and puts, and the detection of dead peers.
//
// Between ranks of one host, endpoints use UCX's error mode NONE so that UCX
// keeps its shared-memory transports (peer mode would fall back to TCP); a
// watchdog run from progress() checks that local peers' processes still exist
// and fails every request toward a dead one. Between hosts, endpoints use peer
// error mode and UCX reports the failure itself.
//
// A Mesh is driven by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/process.hpp"
#include "transport/bootstrap.hpp"
#include "transport/memory.hpp"
#include "transport/request.hpp"
#include "transport/ucx_worker.hpp"

namespace dlop::transport {

// User tags have 44 bits; the top 20 bits of the UCX tag carry the sender's rank.
using Tag = std::uint64_t;
inline constexpr int kUserTagBits = 44;
inline constexpr Tag kMaxUserTag = (Tag{1} << kUserTagBits) - 2;  // the last one is fence()'s

// Active-message handler: sender rank, header and payload (valid during the call).
using AmHandler = std::function<void(int source, std::span<const std::byte> header,
                                     std::span<const std::byte> payload)>;

class Mesh {
 public:
  struct Options {
    std::chrono::milliseconds timeout = config().timeout;    // default for waits
    std::chrono::milliseconds watchdog = config().watchdog;  // liveness check interval
    ProgressMode progress = config().progress;
    std::chrono::microseconds spin = config().spin;          // kAuto: spin this long, then sleep
    std::string host = host_identity();  // ranks with equal hosts share memory
  };

  // Collective over the bootstrap group: exchanges addresses and creates endpoints.
  Mesh(UcxWorker& worker, Bootstrap& bootstrap);
  Mesh(UcxWorker& worker, Bootstrap& bootstrap, const Options& options);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  bool is_local(int peer) const { return peers_.at(static_cast<std::size_t>(peer)).local; }
  const std::string& host_of(int peer) const { return peers_.at(static_cast<std::size_t>(peer)).host; }
  const Options& options() const { return options_; }
  UcxWorker& worker() { return worker_; }

  Request send(int peer, const void* buffer, std::size_t bytes, Tag tag);
  Request recv(int peer, void* buffer, std::size_t bytes, Tag tag);
  Request recv_any(void* buffer, std::size_t bytes, Tag tag);

  // Active messages, for small control messages. The header is copied; the
  // payload must stay valid until the request completes, as for send().
  void set_am_handler(std::uint16_t id, AmHandler handler);
  Request am_send(int peer, std::uint16_t id, std::span<const std::byte> header,
                  std::span<const std::byte> payload);

  RemoteKey unpack_key(int peer, const Bytes& packed);
  // Writes local bytes into the peer's registered memory. Completion frees the
  // local buffer; flush(peer) makes earlier puts visible at the target.
  Request put(int peer, const void* local, std::size_t bytes, std::uint64_t remote_address,
              const RemoteKey& key);
  Request flush(int peer);

  // Exchanges an empty message with every live peer (on a reserved tag), so
  // that no rank leaves while a peer still needs its progress, e.g. for
  // rendezvous acknowledgements. Call it before tearing down a busy mesh;
  // out-of-band barriers do not progress UCX.
  void fence(std::chrono::milliseconds timeout);

  // Progresses UCX and, every watchdog interval, checks the local peers.
  bool progress();
  // Sleeps until UCX has events, at most `timeout` (and one watchdog interval).
  void wait_for_events(std::chrono::milliseconds timeout);

  // Why the peer is considered dead, or nullopt while it is alive.
  const std::optional<std::string>& peer_failure(int peer) const {
    return peers_.at(static_cast<std::size_t>(peer)).failure;
  }
  // How many peers have been found dead so far (0 in a healthy mesh).
  std::size_t dead_peers() const { return dead_peers_; }
  // "rank 3 (pid 1234 on host h)", for error messages.
  std::string describe(int peer) const;
  // Ranks that requests are pending toward (ascending, no duplicates; any-source
  // receives are not counted): who has not answered yet.
  std::vector<int> pending_peers() const;
  // The worker's event fd for callers that poll it with other fds (-1: none).
  int event_fd() const;
  // Arms the worker for events; false if there are events to progress first.
  bool arm();

  // Runs the liveness check now; returns the number of peers newly found dead.
  int check_peers();

 private:
  friend class Request;
  struct Peer {
    Mesh* mesh = nullptr;  // for UCX's endpoint error callback
    int rank = 0;
    ProcessId process;
    std::string host;
    bool local = false;
    ucp_ep_h ep = nullptr;
    std::optional<std::string> failure;
  };
  struct AmContext;

  void connect(const std::vector<Bytes>& addresses);
  void disconnect();
  Request post_result(ucs_status_ptr_t result, detail::OpKind kind, int peer, std::size_t bytes,
                      unsigned char* owned = nullptr);
  ucp_ep_h endpoint_for(int peer, detail::OpKind kind, std::size_t bytes, std::optional<Request>& failed);
  void mark_dead(int peer, const std::string& reason);
  void link(detail::RequestSlot* slot);
  static void unlink(detail::RequestSlot* slot);
  static ucp_request_param_t recv_params();
  static void complete(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info);
  static void on_send_done(void* request, ucs_status_t status, void* user_data);
  static void on_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  UcxWorker& worker_;
  Options options_;
  int rank_;
  std::vector<Peer> peers_;
  std::size_t dead_peers_ = 0;
  detail::RequestSlot pending_;  // sentinel of the pending list
  std::vector<std::unique_ptr<AmContext>> am_contexts_;
  std::chrono::steady_clock::time_point next_check_;
  unsigned progress_calls_ = 0;
  // A send was dropped while UCX still held it (an operation that failed or
  // timed out): see disconnect().
  bool sends_abandoned_ = false;
};

}  // namespace dlop::transport
