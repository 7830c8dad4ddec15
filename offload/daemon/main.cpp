// dlop-offloader: serves batches of a native pipeline to trainers.
//   dlop-offloader --listen HOST:PORT --token-file F --threads N [--metrics-port M]
// Prints "dlop-offloader listening on HOST:PORT" once it accepts connections
// (with the port chosen when PORT is 0), or with --metrics-port
// "dlop-offloader (metrics on HOST:M) listening on HOST:PORT": the data port
// stays last on the line. SIGTERM drains it (server.hpp): it exits 0 once
// drained, 3 when --drain-timeout or a second SIGTERM or SIGINT cut the drain
// short with leases still open (dropped, logged). SIGINT stops it as before (0).
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <optional>
#include <thread>

#include "core/error.hpp"
#include "core/log.hpp"
#include "offload/protocol_auth.hpp"
#include "python_workers.hpp"
#include "server.hpp"
#include "transport/socket.hpp"
#include "transport/tcp_store.hpp"

int main(int argc, char** argv) {
  using namespace dlop;
  CLI::App app{"dlop-offloader: decodes, augments and collates batches for dlop trainers"};
  app.set_version_flag("--version", "dlop-offloader " DLOP_VERSION);
  std::string listen = "127.0.0.1:0";
  std::string token_file;
  std::size_t threads = std::max(1u, std::thread::hardware_concurrency());
  offload::daemon::ServerOptions options;
  app.add_option("--listen", listen, "HOST:PORT to listen on (port 0: any; 0.0.0.0: every interface)")
      ->capture_default_str();
  app.add_option("--token-file", token_file, "file holding the shared token (mode 600)")->required();
  app.add_option("--threads", threads, "compute threads")->capture_default_str()->check(CLI::Range(1, 1024));
  std::string python = offload::daemon::default_python();
  bool no_python = false;
  app.add_option("--python", python,
                 "interpreter for the generic Python path's workers (needs dlop and torch importable)")
      ->capture_default_str();
  app.add_flag("--no-python", no_python,
               "refuse the generic Python path (which runs the client's pickled Dataset as this user)");
  app.add_option("--max-connections", options.max_connections, "control connections at once")->capture_default_str();
  app.add_option("--max-leases", options.max_leases, "open leases per connection")->capture_default_str();
  std::int64_t auth_ms = options.auth_timeout.count(), frame_ms = options.frame_timeout.count();
  app.add_option("--auth-timeout-ms", auth_ms, "time a new connection has to authenticate")->capture_default_str();
  app.add_option("--frame-timeout-ms", frame_ms, "time a frame once begun has to arrive whole")->capture_default_str();
  double drain_s = std::chrono::duration<double>(options.drain_timeout).count();
  app.add_option("--drain-timeout", drain_s,
                 "seconds a drain may take: SIGTERM refuses new leases and connections, finishes and sends the "
                 "batches being made, and exits 0 once none is left; after this long (or on a second SIGTERM or "
                 "SIGINT) it exits anyway, with status 3 if it dropped leases")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  std::optional<std::uint16_t> metrics_port;
  app.add_option("--metrics-port", metrics_port,
                 "serve Prometheus metrics (GET /metrics, HTTP) on this port of the --listen host (0: any free "
                 "port, printed on the ready line); none when not given");
  CLI11_PARSE(app, argc, argv);
  options.auth_timeout = std::chrono::milliseconds(auth_ms);
  options.frame_timeout = std::chrono::milliseconds(frame_ms);
  options.drain_timeout = std::chrono::milliseconds(std::llround(drain_s * 1000));
  options.metrics_port = metrics_port;

  try {
    // Signals are taken through a file descriptor by the event loop; blocked
    // before any thread starts, so every thread inherits the mask.
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &mask, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    transport::net::UniqueFd stop(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!stop) throw_errno("signalfd");

    const auto [host, port] = transport::parse_host_port(listen);
    options.host = host;
    options.port = port;
    options.token = offload::protocol::read_token_file(token_file, /*strict=*/true);
    options.threads = threads;
    options.python = no_python ? std::string() : python;
    char hostname[256] = {};
    ::gethostname(hostname, sizeof(hostname) - 1);
    options.name = std::string("dlop-offloader on ") + hostname;

    offload::daemon::Server server(options);
    const std::string metrics =
        server.metrics_port() ? "(metrics on " + host + ":" + std::to_string(*server.metrics_port()) + ") " : "";
    std::printf("dlop-offloader %slistening on %s:%u\n", metrics.c_str(), host.c_str(),
                static_cast<unsigned>(server.port()));
    std::fflush(stdout);
    log().info("offloader: listening on {}:{} with {} compute threads", host, server.port(), threads);
    switch (server.run(stop.get())) {
      case offload::daemon::Server::End::kStopped:
        log().info("offloader: stopping");
        return 0;
      case offload::daemon::Server::End::kDrained:
        return 0;
      case offload::daemon::Server::End::kDrainCut:
        // Without waiting for the batches still being made (the compute
        // thread may be stuck in one): the kernel closes the connections,
        // and the Python workers die with this process (PR_SET_PDEATHSIG).
        log().flush();
        std::fflush(stdout);
        ::_exit(server.dropped() > 0 ? 3 : 0);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dlop-offloader: %s\n", e.what());
    return 1;
  }
}
