#include "metrics.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iterator>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dlop::offload::daemon {

namespace {

using Clock = std::chrono::steady_clock;

// A request's head, and the time a peer has to send it and take the answer.
constexpr std::size_t kMaxRequest = 8 * 1024;
constexpr auto kRequestTime = std::chrono::seconds(2);

void metric(std::string& out, std::string_view name, std::string_view type, std::string_view help, double value) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

void metric(std::string& out, std::string_view name, std::string_view type, std::string_view help,
            std::uint64_t value) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

// Writes all of `data` before `deadline`; false if the peer did not take it.
bool send_all(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, transport::net::poll_ms(deadline)) <= 0) return false;
  }
  return true;
}

std::string response(std::string_view status, std::string_view content_type, std::string_view body,
                     std::string_view extra_headers = {}) {
  return fmt::format("HTTP/1.0 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n{}", status,
                     content_type, body.size(), extra_headers, body);
}

}  // namespace

std::string prometheus_text(const DaemonStats& stats) {
  const auto get = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  std::string out;
  out.reserve(6144);
  metric(out, "dlop_offloader_busy_ratio", "gauge",
         fmt::format("Share of the last {} s the compute pool spent making batches (the figure each batch "
                     "carries to the trainers).",
                     protocol::BatchReady::kBusyWindow.count()),
         stats.busy.fraction());
  metric(out, "dlop_offloader_busy_seconds_total", "counter",
         "Seconds the compute pool spent making batches (the Python path: worker seconds over the workers).",
         stats.busy.busy_seconds());
  metric(out, "dlop_offloader_compute_threads", "gauge", "Compute threads (--threads).",
         static_cast<std::uint64_t>(stats.busy.capacity()));
  metric(out, "dlop_offloader_batches_made_total", "counter", "Batches made.", get(stats.batch.items));
  metric(out, "dlop_offloader_samples_made_total", "counter", "Samples in the batches made (skipped ones not counted).",
         get(stats.samples_made));
  metric(out, "dlop_offloader_samples_skipped_total", "counter",
         "Samples left out of their batch for a SampleError (the skip policy).", get(stats.samples_skipped));
  metric(out, "dlop_offloader_batches_sent_total", "counter", "Batches delivered into trainers' buffers.",
         get(stats.batches_ready));
  metric(out, "dlop_offloader_batches_failed_total", "counter", "Leases answered with an error.",
         get(stats.batches_failed));
  metric(out, "dlop_offloader_batches_refused_total", "counter",
         "Leases refused while draining, to be made elsewhere.", get(stats.batches_refused));
  metric(out, "dlop_offloader_batches_in_progress", "gauge", "Batches being made now.",
         static_cast<std::uint64_t>(stats.busy.running()));
  metric(out, "dlop_offloader_leases_in_progress", "gauge", "Leases open: queued, being made or being sent.",
         get(stats.open_leases));
  metric(out, "dlop_offloader_leases_canceled_total", "counter", "Leases the trainers canceled.",
         get(stats.leases_canceled));
  metric(out, "dlop_offloader_connections_open", "gauge", "Open control connections.", get(stats.open_connections));
  metric(out, "dlop_offloader_connections_accepted_total", "counter", "Control connections accepted.",
         get(stats.connections));
  metric(out, "dlop_offloader_auth_failures_total", "counter",
         "Connections refused for a wrong or missing token: a trainer with another token than the fleet's.",
         get(stats.auth_failures));
  metric(out, "dlop_offloader_protocol_errors_total", "counter", "Connections closed for a malformed frame.",
         get(stats.protocol_errors));
  metric(out, "dlop_offloader_draining", "gauge", "1 after SIGTERM: no new lease or connection is taken.",
         std::uint64_t{stats.draining.load(std::memory_order_relaxed) ? 1u : 0u});
  // The stages dlop offloader-stats shows, one series each.
  const std::pair<const char*, const StageCounter*> stages[] = {
      {"read", &stats.read},       {"decode", &stats.decode}, {"augment", &stats.augment},
      {"collate", &stats.collate}, {"batch", &stats.batch},   {"send", &stats.send}};
  const auto family = [&](std::string_view name, std::string_view help, auto value) {
    fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} counter\n", name, help, name);
    for (const auto& [stage, counter] : stages) {
      fmt::format_to(std::back_inserter(out), "{}{{stage=\"{}\"}} {}\n", name, stage, value(*counter));
    }
  };
  family("dlop_offloader_stage_items_total", "Items through each stage: samples (read, decode, augment, collate), "
         "batches (batch, send).", [&](const StageCounter& c) { return get(c.items); });
  family("dlop_offloader_stage_seconds_total", "Seconds in each stage, summed over the compute threads.",
         [](const StageCounter& c) { return static_cast<double>(c.nanoseconds.load(std::memory_order_relaxed)) * 1e-9; });
  family("dlop_offloader_stage_bytes_total", "Bytes through each stage: encoded bytes read, decoded bytes, bytes "
         "collated, batched and sent.", [&](const StageCounter& c) { return get(c.bytes); });
  return out;
}

MetricsServer::MetricsServer(const std::string& host, std::uint16_t port, const DaemonStats& stats)
    : stats_(stats), stop_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!stop_) throw_errno("eventfd");
  try {
    listener_ = transport::net::listen_tcp(host, port);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find(std::strerror(EADDRINUSE)) != std::string::npos) {
      throw_error(Errc::kInvalidArgument, fmt::format("--metrics-port {}: port {} on {} is taken ({}); choose another, "
                                                      "or 0 for any free port",
                                                      port, port, host, std::strerror(EADDRINUSE)));
    }
    throw_error(Errc::kInvalidArgument, fmt::format("--metrics-port {}: {}", port, what));
  }
  port_ = transport::net::local_port(listener_.get());
  thread_ = std::thread([this] { run(); });
}

MetricsServer::~MetricsServer() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(stop_.get(), &one, sizeof(one));
  thread_.join();
}

void MetricsServer::run() {
  pthread_setname_np(pthread_self(), "dlop-metrics");
  while (true) {
    pollfd fds[2] = {{stop_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    const int n = ::poll(fds, 2, -1);
    if (n < 0 && errno != EINTR) {
      log().error("offloader: metrics endpoint: poll: {}", std::strerror(errno));
      return;
    }
    if (n <= 0) continue;
    if ((fds[0].revents & POLLIN) != 0) return;
    if ((fds[1].revents & POLLIN) == 0) continue;
    while (true) {
      transport::net::UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd) break;  // none left (or a transient failure: poll again)
      serve(fd.get());
    }
  }
}

void MetricsServer::serve(int fd) {
  const auto deadline = Clock::now() + kRequestTime;
  std::string request;
  while (request.find("\r\n\r\n") == std::string::npos && request.find("\n\n") == std::string::npos) {
    if (request.size() >= kMaxRequest) {
      send_all(fd, response("431 Request Header Fields Too Large", "text/plain", "request too large\n"), deadline);
      return;
    }
    char buf[1024];
    const ssize_t n = ::recv(fd, buf, std::min(sizeof(buf), kMaxRequest - request.size()), 0);
    if (n > 0) {
      request.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) break;  // a request without its blank line: answer what came
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, transport::net::poll_ms(deadline)) <= 0) return;  // too slow: dropped
  }
  // "GET /metrics HTTP/1.1": the method, then the path up to a query or a space.
  const std::string_view line = std::string_view(request).substr(0, request.find_first_of("\r\n"));
  const auto space = line.find(' ');
  const std::string_view method = line.substr(0, space);
  std::string_view path = space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
  path = path.substr(0, path.find_first_of(" ?"));
  std::string answer;
  if (method != "GET") {
    answer = response("405 Method Not Allowed", "text/plain", "only GET /metrics\n", "Allow: GET\r\n");
  } else if (path != "/metrics") {
    answer = response("404 Not Found", "text/plain", "the metrics are at /metrics\n");
  } else {
    answer = response("200 OK", "text/plain; version=0.0.4; charset=utf-8",
                      prometheus_text(stats_));
  }
  send_all(fd, answer, deadline);
}

}  // namespace dlop::offload::daemon
