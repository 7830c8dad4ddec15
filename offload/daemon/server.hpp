// The dlop-offloader event loop: one thread that accepts control
// connections, authenticates them, parses their frames, hands batch jobs to
// the Executor and sends finished batches through the UcxSender.
//
// Nothing from the network is trusted: a frame that breaks the protocol
// closes its own connection with a logged reason; a client that vanishes
// loses its own leases; other clients are not disturbed. The daemon keeps no
// state beyond its connections and their leases.
//
// SIGTERM drains it (spot reclaims, scale-downs): it stops listening, answers
// new and queued leases with ERROR(kBusy) so that the trainers lease them
// elsewhere at once, finishes and sends the batches it is making, closes each
// connection once its last answer is out, and returns when none is left, or
// when drain_timeout has passed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <spdlog/common.h>

#include "executor.hpp"
#include "metrics.hpp"
#include "python_workers.hpp"
#include "offload/protocol.hpp"
#include "offload/protocol_auth.hpp"
#include "offload/protocol_messages.hpp"
#include "transport/socket.hpp"
#include "stats.hpp"
#include "ucx_sender.hpp"

namespace dlop::offload::daemon {

// ERROR(kBusy)'s text for a lease refused while draining: the trainer's
// LeaseManager leases the batch to another daemon at once.
inline constexpr const char* kDrainingRefusal =
    "dlop-offloader is draining (SIGTERM): it takes no new lease; lease the batch elsewhere";

struct ServerOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;       // 0: any free port (see Server::port())
  std::string token;            // the shared secret (see protocol_auth.hpp)
  std::size_t threads = 1;      // compute threads
  std::string name;             // sent in WELCOME, for clients' logs
  // A connection must authenticate within this long after it is accepted,
  // and a frame once begun must be complete within frame_timeout: slow or
  // stalled peers cannot hold connections open.
  std::chrono::milliseconds auth_timeout{10'000};
  std::chrono::milliseconds frame_timeout{30'000};
  std::size_t max_connections = 256;
  std::size_t max_leases = 64;  // open leases per connection; more get ERROR(kBusy)
  std::size_t max_output = 64u << 20;  // bytes queued for a client that does not read: then closed
  // The interpreter for the generic Python path's workers; empty: the path is
  // refused (the token then grants running the client's code, as this user).
  std::string python;
  // How long a drain (SIGTERM) may take before run() returns anyway.
  std::chrono::milliseconds drain_timeout{20'000};
  // Where the metrics endpoint listens, on `host` (0: any port); none: no endpoint.
  std::optional<std::uint16_t> metrics_port;
};

class Server {
 public:
  explicit Server(ServerOptions options);  // binds and listens; throws kSystem naming host:port
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  std::uint16_t port() const { return port_; }
  // The metrics endpoint's port, when there is one.
  std::optional<std::uint16_t> metrics_port() const;

  enum class End {
    kStopped,   // SIGINT
    kDrained,   // SIGTERM, then nothing was left in flight
    kDrainCut,  // SIGTERM, then drain_timeout passed or another signal came, with leases open (logged)
  };
  // Serves until a signal arrives on `signal_fd` (a signalfd for SIGINT and SIGTERM).
  End run(int signal_fd);
  // After kDrainCut: the leases it left open.
  std::size_t dropped() const { return dropped_; }

 private:
  enum class LeaseState { kQueued, kSending };  // queued or being made; being sent
  struct Lease {
    LeaseState state = LeaseState::kQueued;
    bool canceled = false;
    std::uint64_t address = 0;  // a direct connection's buffer in the client; 0: over UCX
  };
  struct Conn {
    std::uint64_t id = 0;
    transport::net::UniqueFd fd;
    std::string peer;  // "ip:port", then "ip:port (client name)" once known
    protocol::FrameDecoder decoder{protocol::kMaxPreAuthPayload};
    protocol::FrameWriter writer;
    protocol::Bytes out;
    std::size_t out_sent = 0;
    bool authenticated = false;
    protocol::Nonce server_nonce{};
    std::chrono::steady_clock::time_point accepted;
    std::chrono::steady_clock::time_point partial_since{};  // a frame began; {} when none
    std::shared_ptr<const Dataset> dataset;
    std::unique_ptr<PythonWorkers> python;  // the generic Python path's workers, killed with the connection
    std::optional<protocol::Configure> loading;  // a Python CONFIGURE whose workers are still loading
    std::uint64_t endpoint = 0;  // UcxSender id, 0 until CONFIGURE
    std::size_t piece_bytes = 0;  // CONFIGURE's: batches over UCX go in pieces of this size
    protocol::Nonce direct_nonce{};  // sent in WELCOME; a same-host client shows it back from its memory
    std::uint32_t direct_pid = 0;    // nonzero: batches are written straight into this client process
    std::map<std::uint64_t, Lease> leases;
    // Draining, with every answer out: our side is shut, and what comes in is
    // dropped, until the peer closes or has acknowledged every byte.
    bool closing = false;
    bool closed = false;
  };

  // server.cpp: connections and bytes.
  void accept_all();
  void on_readable(Conn& c);
  void on_writable(Conn& c);
  void close_conn(Conn& c, const std::string& reason, bool warn);
  void check_deadlines();
  std::chrono::steady_clock::time_point next_deadline() const;
  void send_frame(Conn& c, protocol::MsgType type, const protocol::Bytes& payload);
  template <class M>
  void reply(Conn& c, const M& message) {
    send_frame(c, M::kType, protocol::encode(message));
  }
  void drain_wake_fd();
  std::size_t open_leases() const;
  // Draining: the first SIGTERM; then, on every pass of the loop, shuts the
  // connections that have nothing in flight and closes those shut that are done.
  void begin_drain();
  void close_drained();
  void discard_input(Conn& c);
  // The leases of open connections (open_leases() counts also the sends of
  // closed ones), and their list by connection, for the log.
  std::size_t held_leases() const;
  std::string open_leases_text() const;

  // server_messages.cpp: what the frames mean.
  void on_frame(Conn& c, protocol::Frame frame);
  void on_hello(Conn& c, const protocol::Frame& frame);
  void on_configure(Conn& c, const protocol::Configure& m);
  void configure_python(Conn& c, protocol::Configure m);
  // Answers the Python CONFIGUREs whose first worker has loaded or failed.
  void on_python_loads();
  void on_produce(Conn& c, protocol::Produce m);
  void on_cancel(Conn& c, std::uint64_t lease);
  void on_results();
  // Writes a finished batch straight into its direct client and answers.
  void write_direct(Conn& c, JobResult& r, std::uint64_t address);
  void on_sent(std::uint64_t conn, std::uint64_t lease, protocol::BatchReady ready, const std::optional<std::string>& error,
               bool announced);
  // Sends a BATCH_READY with the daemon's busy fraction as it is now.
  void reply_ready(Conn& c, protocol::BatchReady ready);
  // One open source per (kind, path), shared by the connections that use it.
  std::shared_ptr<const media::Source> open_source_cached(const std::string& path, std::string_view kind);

  ServerOptions options_;
  transport::net::UniqueFd listener_;
  std::uint16_t port_ = 0;
  transport::net::UniqueFd wake_;  // eventfd the executor writes when results are ready
  DaemonStats stats_;
  // Owned by pointer so that ~Server can destroy it (running its last send
  // callbacks) while the executor and the connection map still exist.
  std::unique_ptr<UcxSender> sender_ = std::make_unique<UcxSender>();
  std::unique_ptr<Executor> executor_;
  std::map<std::uint64_t, std::unique_ptr<Conn>> conns_;
  std::uint64_t next_conn_ = 1;
  std::size_t sends_in_flight_ = 0;  // batches handed to UCX, whatever became of their connection
  bool draining_ = false;
  std::chrono::steady_clock::time_point drain_deadline_{};
  std::uint64_t sent_before_drain_ = 0;  // batches_ready when the drain began
  std::size_t dropped_ = 0;
  spdlog::level::level_enum drain_level_ = spdlog::level::info;  // of the drain's log lines
  // Sources open for some connection, shared so that several connections on
  // one dataset scan it once; dropped with the last user.
  std::map<std::string, std::weak_ptr<const media::Source>> sources_;
  // After stats_, so that it stops before them.
  std::unique_ptr<MetricsServer> metrics_;
};

}  // namespace dlop::offload::daemon
