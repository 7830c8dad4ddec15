#include "server.hpp"

#include <linux/sockios.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "offload/protocol_messages.hpp"

namespace dlop::offload::daemon {

using Clock = std::chrono::steady_clock;

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      listener_(transport::net::listen_tcp(options_.host, options_.port)),
      port_(transport::net::local_port(listener_.get())),
      wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!wake_) throw_errno("eventfd");
  executor_ = std::make_unique<Executor>(options_.threads, stats_, [fd = wake_.get()] {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof(one));
  });
  if (options_.metrics_port) metrics_ = std::make_unique<MetricsServer>(options_.host, *options_.metrics_port, stats_);
}

std::optional<std::uint16_t> Server::metrics_port() const {
  if (!metrics_) return std::nullopt;
  return metrics_->port();
}

Server::~Server() {
  for (auto& [id, c] : conns_) {
    if (!c->closed) close_conn(*c, "daemon stopping", false);
  }
  // Let UCX fail or finish the sends of the closed endpoints, so their
  // callbacks give the buffers back while the executor still exists.
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (open_leases() > 0 && Clock::now() < deadline) {
    sender_->progress();
    conns_.clear();
  }
  sender_.reset();
  executor_.reset();
}

std::size_t Server::open_leases() const {
  std::size_t n = 0;
  for (const auto& [id, c] : conns_) n += c->leases.size();
  return n + sends_in_flight_;
}

void Server::send_frame(Conn& c, protocol::MsgType type, const protocol::Bytes& payload) {
  if (c.closed || c.closing) return;
  const protocol::Bytes frame = c.writer.encode(type, payload);
  if (c.out.size() - c.out_sent + frame.size() > options_.max_output) {
    close_conn(c, "client does not read its replies (" + std::to_string(c.out.size() - c.out_sent) + " bytes queued)",
               true);
    return;
  }
  c.out.insert(c.out.end(), frame.begin(), frame.end());
  on_writable(c);  // most replies fit the socket buffer at once
}

Server::End Server::run(int signal_fd) {
  std::vector<pollfd> fds;
  std::vector<Conn*> polled;
  while (true) {
    while (sender_->progress()) {
    }
    drain_wake_fd();
    on_results();
    on_python_loads();
    check_deadlines();
    if (draining_) close_drained();
    std::erase_if(conns_, [](const auto& kv) { return kv.second->closed; });
    stats_.open_leases.store(open_leases(), std::memory_order_relaxed);
    stats_.open_connections.store(conns_.size(), std::memory_order_relaxed);
    if (draining_ && conns_.empty() && sends_in_flight_ == 0) {
      log().log(drain_level_, "offloader: drained: {} batches sent since SIGTERM, {} leases refused; exiting",
                stats_.batches_ready.load(std::memory_order_relaxed) - sent_before_drain_,
                stats_.batches_refused.load(std::memory_order_relaxed));
      return End::kDrained;
    }
    if (draining_ && Clock::now() >= drain_deadline_) {
      dropped_ = held_leases();
      log().error("offloader: the drain took longer than --drain-timeout ({} s): exiting with {} leases in flight "
                  "dropped ({}); their trainers lease them again elsewhere",
                  std::chrono::duration<double>(options_.drain_timeout).count(), dropped_, open_leases_text());
      return End::kDrainCut;
    }

    fds.clear();
    polled.clear();
    fds.push_back({signal_fd, POLLIN, 0});
    fds.push_back({wake_.get(), POLLIN, 0});
    fds.push_back({listener_.get(), POLLIN, 0});
    const bool armed = sender_->event_fd() < 0 || sender_->arm();
    fds.push_back({sender_->event_fd(), POLLIN, 0});
    for (auto& [id, c] : conns_) {
      short events = POLLIN;
      if (c->out_sent < c->out.size()) events |= POLLOUT;
      fds.push_back({c->fd.get(), events, 0});
      polled.push_back(c.get());
    }
    const int n = ::poll(fds.data(), fds.size(), armed ? transport::net::poll_ms(next_deadline()) : 0);
    if (n < 0 && errno != EINTR) throw_errno("poll");
    if (n <= 0) continue;
    if ((fds[0].revents & (POLLIN | POLLHUP)) != 0) {
      signalfd_siginfo si{};
      bool drain = false;
      while (::read(signal_fd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
        // SIGTERM drains; SIGINT stops; any signal once draining stops now.
        if (draining_ || drain) {
          dropped_ = held_leases();
          log().error("offloader: {} while draining: exiting now with {} leases in flight dropped ({}); their "
                      "trainers lease them again elsewhere",
                      si.ssi_signo == SIGTERM ? "another SIGTERM" : "SIGINT", dropped_, open_leases_text());
          return End::kDrainCut;
        }
        if (si.ssi_signo != SIGTERM) return End::kStopped;
        drain = true;
      }
      if (drain) {
        begin_drain();
        continue;  // the connections polled may have changed
      }
    }
    for (std::size_t i = 0; i < polled.size(); ++i) {
      const short ev = fds[i + 4].revents;
      Conn& c = *polled[i];
      if (c.closing) {
        if ((ev & (POLLIN | POLLHUP | POLLERR)) != 0) discard_input(c);
        continue;
      }
      if ((ev & (POLLIN | POLLHUP | POLLERR)) != 0) on_readable(c);
      if (!c.closed && (ev & POLLOUT) != 0) on_writable(c);
    }
    if (listener_ && (fds[2].revents & POLLIN) != 0) accept_all();
  }
}

void Server::begin_drain() {
  draining_ = true;
  stats_.draining.store(true, std::memory_order_relaxed);
  drain_deadline_ = Clock::now() + options_.drain_timeout;
  sent_before_drain_ = stats_.batches_ready.load(std::memory_order_relaxed);
  listener_.reset();  // new connections are refused by the kernel
  // Leases not begun yet go back now, to be made elsewhere at once.
  std::size_t refused = 0, making = 0;
  for (auto& [id, conn] : conns_) {
    Conn& c = *conn;
    if (c.closed) continue;
    for (auto it = c.leases.begin(); it != c.leases.end();) {
      const std::uint64_t lease = it->first;
      const bool queued = it->second.state == LeaseState::kQueued &&
                          (c.python ? c.python->cancel_queued(lease) : executor_->cancel_queued(c.id, lease));
      if (!queued) {
        ++making;
        ++it;
        continue;
      }
      it = c.leases.erase(it);
      ++refused;
      stats_.batches_refused.fetch_add(1, std::memory_order_relaxed);
      reply(c, protocol::ErrorMsg{lease, protocol::ErrorCode::kBusy, kDrainingRefusal});
    }
  }
  // A daemon with nothing to finish (a job that ended) says so quietly.
  drain_level_ = making + refused > 0 ? spdlog::level::warn : spdlog::level::info;
  log().log(drain_level_,
            "offloader: SIGTERM: draining: {} leases being made or sent are finished, {} queued ones refused; no "
            "new connection or lease is taken; exiting once nothing is in flight, or in {} s (--drain-timeout)",
            making, refused, std::chrono::duration<double>(options_.drain_timeout).count());
}

void Server::close_drained() {
  for (auto& [id, conn] : conns_) {
    Conn& c = *conn;
    if (c.closed) continue;
    if (c.closing) {
      // Every byte of ours, and our FIN, acknowledged: the answers are with
      // the client, whatever it sends from now on.
      int unacked = 0;
      if (::ioctl(c.fd.get(), SIOCOUTQ, &unacked) != 0 || unacked == 0) close_conn(c, "drained", false);
      continue;
    }
    if (!c.leases.empty() || c.out_sent < c.out.size()) continue;
    // Nothing in flight, every answer handed to the kernel: shut our side.
    // Closing at once could reset the connection (when a request is on its
    // way) and lose the answers not yet acknowledged.
    ::shutdown(c.fd.get(), SHUT_WR);
    c.closing = true;
    c.loading.reset();
    log().info("offloader: connection {} from {}: drained, closing", c.id, c.peer);
  }
}

void Server::discard_input(Conn& c) {
  std::uint8_t buf[4096];
  while (true) {
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
    if (n > 0) continue;  // a request that came too late: its lease is reissued when the client sees the close
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    return close_conn(c, "drained", false);  // the client closed too
  }
}

std::size_t Server::held_leases() const {
  std::size_t n = 0;
  for (const auto& [id, c] : conns_) n += c->closed ? 0 : c->leases.size();
  return n;
}

std::string Server::open_leases_text() const {
  std::string text;
  for (const auto& [id, c] : conns_) {
    if (c->closed || c->leases.empty()) continue;
    if (!text.empty()) text += "; ";
    text += fmt::format("connection {} from {}: lease", c->id, c->peer);
    if (c->leases.size() > 1) text += "s";
    bool first = true;
    for (const auto& [lease, l] : c->leases) {
      text += fmt::format("{} {}", first ? "" : ",", lease);
      first = false;
    }
  }
  return text.empty() ? "none" : text;
}

void Server::drain_wake_fd() {
  std::uint64_t value = 0;
  [[maybe_unused]] const ssize_t n = ::read(wake_.get(), &value, sizeof(value));
}

void Server::accept_all() {
  while (true) {
    transport::net::UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) log().warn("offloader: accept: {}", std::strerror(errno));
      return;
    }
    const std::string peer = transport::net::peer_name(fd.get());
    if (conns_.size() >= options_.max_connections) {
      log().warn("offloader: refused {}: already {} connections", peer, conns_.size());
      continue;
    }
    transport::net::tune_socket(fd.get());
    auto c = std::make_unique<Conn>();
    c->id = next_conn_++;
    c->fd = std::move(fd);
    c->peer = peer;
    c->accepted = Clock::now();
    stats_.connections.fetch_add(1, std::memory_order_relaxed);
    log().info("offloader: connection {} from {}", c->id, c->peer);
    Conn& ref = *c;
    conns_.emplace(c->id, std::move(c));
    try {
      ref.server_nonce = protocol::random_nonce();
      reply(ref, protocol::Challenge{ref.server_nonce});
    } catch (const std::exception& e) {
      close_conn(ref, e.what(), true);
    }
  }
}

void Server::on_readable(Conn& c) {
  std::uint8_t buf[64 * 1024];
  // Read a bounded amount per pass, so one busy client cannot starve others.
  for (int pass = 0; pass < 16 && !c.closed; ++pass) {
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
    if (n == 0) {
      close_conn(c, c.decoder.partial() ? "disconnected in the middle of a frame" : "disconnected",
                 c.decoder.partial() || !c.authenticated);
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) close_conn(c, std::string("recv: ") + std::strerror(errno), true);
      return;
    }
    try {
      c.decoder.feed(std::span(buf, static_cast<std::size_t>(n)));
      while (!c.closed) {
        std::optional<protocol::Frame> frame = c.decoder.next();
        if (!frame) break;
        on_frame(c, std::move(*frame));
      }
    } catch (const Error& e) {
      if (e.code() == Errc::kProtocol) stats_.protocol_errors.fetch_add(1, std::memory_order_relaxed);
      close_conn(c, e.what(), true);
      return;
    } catch (const std::exception& e) {
      close_conn(c, e.what(), true);
      return;
    }
    if (c.decoder.partial()) {
      if (c.partial_since == Clock::time_point{}) c.partial_since = Clock::now();
    } else {
      c.partial_since = {};
    }
  }
}

void Server::on_writable(Conn& c) {
  while (!c.closed && c.out_sent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) close_conn(c, std::string("send: ") + std::strerror(errno), false);
      return;
    }
    c.out_sent += static_cast<std::size_t>(n);
  }
  if (c.out_sent == c.out.size()) {
    c.out.clear();
    c.out_sent = 0;
  }
}

void Server::close_conn(Conn& c, const std::string& reason, bool warn) {
  if (c.closed) return;
  if (warn) {
    log().warn("offloader: closing connection {} from {}: {}", c.id, c.peer, reason);
  } else {
    log().info("offloader: closing connection {} from {}: {}", c.id, c.peer, reason);
  }
  // Whatever replies are queued (e.g. an authentication ERROR) get one try.
  if (c.out_sent < c.out.size()) {
    [[maybe_unused]] const ssize_t n =
        ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  c.closed = true;
  c.fd.reset();
  executor_->drop_connection(c.id);
  // Its sends fail now; their callbacks return the buffers (on_sent).
  if (c.endpoint != 0) sender_->disconnect(c.endpoint);
  c.leases.clear();
}

void Server::check_deadlines() {
  const auto now = Clock::now();
  for (auto& [id, c] : conns_) {
    if (c->closed) continue;
    if (!c->authenticated && now - c->accepted > options_.auth_timeout) {
      close_conn(*c, "did not authenticate in time", true);
    } else if (c->partial_since != Clock::time_point{} && now - c->partial_since > options_.frame_timeout) {
      close_conn(*c, "stalled in the middle of a frame", true);
    }
  }
}

Clock::time_point Server::next_deadline() const {
  auto deadline = Clock::time_point::max();
  for (const auto& [id, c] : conns_) {
    if (!c->authenticated) deadline = std::min(deadline, c->accepted + options_.auth_timeout);
    if (c->partial_since != Clock::time_point{}) deadline = std::min(deadline, c->partial_since + options_.frame_timeout);
  }
  if (draining_) deadline = std::min(deadline, drain_deadline_);
  // Wake now and then regardless: UCX's event fd is not a promise on every
  // transport (and a draining connection's last bytes are acknowledged).
  return std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
}

}  // namespace dlop::offload::daemon
