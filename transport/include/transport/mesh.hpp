// Mesh: endpoints from this process to every rank of a bootstrap group (an
// Endpoints whose peer index is the rank), with rank-addressed tagged
// send/recv, and the detection of dead local peers.
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
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/process.hpp"
#include "transport/bootstrap.hpp"
#include "transport/endpoints.hpp"
#include "transport/request.hpp"
#include "transport/ucx_worker.hpp"

namespace dlop::transport {

// User tags have 44 bits; the top 20 bits of the UCX tag carry the sender's rank.
using Tag = std::uint64_t;
inline constexpr int kUserTagBits = 44;
inline constexpr Tag kMaxUserTag = (Tag{1} << kUserTagBits) - 2;  // the last one is fence()'s

class Mesh {
 public:
  struct Options {
    std::chrono::milliseconds timeout = config().timeout;    // default for waits
    std::chrono::milliseconds watchdog = config().watchdog;  // liveness check interval
    ProgressMode progress = config().progress;  // kAuto: the process's WaitPolicy (core/wait_policy.hpp)
    std::chrono::microseconds spin = config().spin;          // the longest a spinning wait polls before it blocks
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

  // Exchanges an empty message with every live peer (on a reserved tag), so
  // that no rank leaves while a peer still needs its progress, e.g. for
  // rendezvous acknowledgements. Call it before tearing down a busy mesh;
  // out-of-band barriers do not progress UCX.
  void fence(std::chrono::milliseconds timeout);

  // Progresses UCX and, every watchdog interval, checks the local peers.
  bool progress() { return endpoints_.progress(); }

  // Why the peer is considered dead, or nullopt while it is alive.
  const std::optional<std::string>& peer_failure(int peer) const { return endpoints_.failure(peer); }
  // How many peers have been found dead so far (0 in a healthy mesh).
  std::size_t dead_peers() const { return endpoints_.dead_peers(); }
  // "rank 3 (pid 1234 on host h)", for error messages.
  std::string describe(int peer) const { return endpoints_.describe(peer); }
  // Ranks that requests are pending toward (ascending, no duplicates; any-source
  // receives are not counted): who has not answered yet.
  std::vector<int> pending_peers() const { return endpoints_.pending_peers(); }
  // The worker's event fd for callers that poll it with other fds (-1: none).
  int event_fd() const;
  // Arms the worker for events; false if there are events to progress first.
  bool arm();

  // Runs the liveness check now; returns the number of peers newly found dead.
  int check_peers();

 private:
  struct Peer {
    ProcessId process;
    std::string host;
    bool local = false;
  };

  void connect(const std::vector<Bytes>& records);

  UcxWorker& worker_;
  Options options_;
  int rank_;
  std::vector<Peer> peers_;
  Endpoints endpoints_;
};

}  // namespace dlop::transport
