// The daemon's metrics endpoint (--metrics-port): Prometheus text for
// `GET /metrics`, over HTTP/1.0 on a port of its own beside the data port,
// answered by one thread that reads DaemonStats (atomics, and the busy meter)
// and never touches the event loop's state. Unauthenticated: it shows
// counters only.
#pragma once

#include <cstdint>
#include <string>
#include <thread>

#include "transport/socket.hpp"
#include "stats.hpp"

namespace dlop::offload::daemon {

// The exposition text of `stats` now.
std::string prometheus_text(const DaemonStats& stats);

class MetricsServer {
 public:
  // Listens on host:port (0: any) and starts its thread. A port that cannot
  // be had (taken, or not ours to take) throws kInvalidArgument naming it and
  // --metrics-port.
  MetricsServer(const std::string& host, std::uint16_t port, const DaemonStats& stats);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  std::uint16_t port() const { return port_; }

 private:
  void run();
  // Reads one request and answers it, within a few seconds whatever the peer does.
  void serve(int fd);

  const DaemonStats& stats_;
  transport::net::UniqueFd listener_;
  std::uint16_t port_ = 0;
  transport::net::UniqueFd stop_;  // eventfd: the destructor's word to the thread
  std::thread thread_;
};

}  // namespace dlop::offload::daemon
