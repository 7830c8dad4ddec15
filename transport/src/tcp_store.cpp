#include "transport/tcp_store.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <map>
#include <vector>

#include "core/config.hpp"
#include "core/log.hpp"
#include "tcp_store_protocol.hpp"

namespace dlop::transport {

using namespace tcp_store_detail;
using namespace net;

namespace {

constexpr std::size_t kReadChunk = 256 * 1024;
constexpr auto kMaxWait = std::chrono::hours(24 * 365);

}  // namespace

// ---------------------------------------------------------------- server ----

class TcpStoreServer::Loop {
 public:
  Loop(UniqueFd listener, UniqueFd wake, std::string name)
      : listener_(std::move(listener)), wake_(std::move(wake)), name_(std::move(name)) {}

  void stop() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  }

  void run() {
    try {
      serve();
    } catch (const std::exception& e) {
      log().error("tcp store {}: server thread stopped: {}", name_, e.what());
    }
  }

 private:
  struct Conn {
    UniqueFd fd;
    std::string peer;
    Bytes in;                       // the request being read: header, key, value
    std::optional<Header> header;   // decoded once in holds a whole header
    Bytes out;                      // reply not yet sent
    std::size_t out_sent = 0;
    std::optional<std::string> parked;  // key of a GET waiting to be set
    Clock::time_point deadline;
    bool dead = false;
  };

  void serve() {
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      const bool accepting = Clock::now() >= accept_paused_until_;
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({listener_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
      for (const auto& c : conns_) {
        short events = POLLIN;
        if (c->out_sent < c->out.size()) events = POLLOUT;
        else if (c->parked) events = POLLRDHUP;  // only notice the client going away
        fds.push_back({c->fd.get(), events, 0});
      }
      const int n = ::poll(fds.data(), fds.size(), next_timeout(accepting));
      if (n < 0 && errno != EINTR) throw_errno("poll");
      if (fds[0].revents != 0) return;  // stop() was called
      const std::size_t known = conns_.size();
      for (std::size_t i = 0; n > 0 && i < known; ++i) on_event(*conns_[i], fds[i + 2].revents);
      if (n > 0 && (fds[1].revents & POLLIN) != 0) accept_all();
      expire_waiters();
      std::erase_if(conns_, [](const auto& c) { return c->dead; });
    }
  }

  int next_timeout(bool accepting) const {
    auto deadline = Clock::time_point::max();
    if (!accepting) deadline = accept_paused_until_;
    for (const auto& c : conns_) {
      if (c->parked) deadline = std::min(deadline, c->deadline);
    }
    return poll_ms(deadline);
  }

  void accept_all() {
    while (true) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          // Out of descriptors or memory: keep serving the connections we have.
          log().warn("tcp store {}: accept: {}; pausing accepts for 100 ms", name_, std::strerror(errno));
          accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
        }
        return;
      }
      tune_socket(fd);
      auto conn = std::make_unique<Conn>();
      conn->fd.reset(fd);
      conn->peer = peer_name(fd);
      conns_.push_back(std::move(conn));
    }
  }

  // Empties a buffer without keeping a large one per idle client.
  static void release(Bytes& buffer) {
    if (buffer.capacity() > kReadChunk) Bytes().swap(buffer);
    else buffer.clear();
  }

  void close_conn(Conn& c, const std::string& reason, bool warn) {
    if (warn) log().warn("tcp store {}: closing connection from {}: {}", name_, c.peer, reason);
    else log().debug("tcp store {}: closing connection from {}: {}", name_, c.peer, reason);
    c.fd.reset();
    c.dead = true;
    c.parked.reset();
  }

  void on_event(Conn& c, short revents) {
    if (c.dead || revents == 0) return;
    if ((revents & (POLLERR | POLLNVAL)) != 0) return close_conn(c, "socket error", !c.in.empty() || c.parked);
    if (c.out_sent < c.out.size()) return flush(c);
    if (c.parked) return close_conn(c, "client went away during a waiting get", false);
    read_request(c);
  }

  // Reads at most the rest of one request, then handles it once complete.
  void read_request(Conn& c) {
    while (true) {
      const std::size_t need = c.header ? kHeaderSize + c.header->key_len + c.header->value_len : kHeaderSize;
      if (c.in.size() == need && c.header) break;
      const std::size_t old = c.in.size();
      const std::size_t chunk = std::min(need - old, kReadChunk);
      c.in.resize(old + chunk);
      const ssize_t n = ::recv(c.fd.get(), c.in.data() + old, chunk, 0);
      c.in.resize(old + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
      if (n == 0) return close_conn(c, old == 0 ? "closed by the client" : "closed by the client mid-message", old != 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return close_conn(c, fmt::format("recv: {}", std::strerror(errno)), true);
      }
      if (!c.header && c.in.size() == kHeaderSize) {
        std::string why;
        c.header = decode(c.in.data(), true, why);
        if (!c.header) return close_conn(c, "malformed request: " + why, true);
      }
    }
    try {
      handle(c);
    } catch (const std::exception& e) {
      close_conn(c, fmt::format("cannot serve request: {}", e.what()), true);
    }
  }

  void handle(Conn& c) {
    const Header h = *c.header;
    const std::string key(c.in.begin() + kHeaderSize, c.in.begin() + static_cast<std::ptrdiff_t>(kHeaderSize + h.key_len));
    const auto value_begin = c.in.begin() + static_cast<std::ptrdiff_t>(kHeaderSize + h.key_len);
    Header reply{h.op, Status::kOk, 0, 0, 0};
    switch (h.op) {
      case Op::kSet:
        store_[key].assign(value_begin, c.in.end());
        respond(c, reply, nullptr);
        wake_waiters(key);
        break;
      case Op::kGet:
        if (const auto it = store_.find(key); it != store_.end()) {
          respond(c, reply, &it->second);
        } else if (h.arg <= 0) {
          respond(c, {h.op, Status::kNotFound, 0, 0, 0}, nullptr);
        } else {
          c.parked = key;
          c.deadline = Clock::now() + std::min<std::chrono::milliseconds>(std::chrono::milliseconds(h.arg), kMaxWait);
        }
        break;
      case Op::kAdd: {
        const auto it = store_.find(key);
        std::int64_t value = 0;
        if (it != store_.end() && !parse_decimal(it->second, value)) {
          respond_error(c, fmt::format("add: the value of key '{}' is not a decimal integer", key));
          break;
        }
        if (__builtin_add_overflow(value, h.arg, &value)) {
          respond_error(c, fmt::format("add: key '{}' would overflow", key));
          break;
        }
        const std::string text = std::to_string(value);
        store_[key].assign(text.begin(), text.end());
        reply.arg = value;
        respond(c, reply, nullptr);
        wake_waiters(key);
        break;
      }
      case Op::kErase:
        reply.arg = static_cast<std::int64_t>(store_.erase(key));
        respond(c, reply, nullptr);
        break;
    }
    release(c.in);
    c.header.reset();
  }

  void respond_error(Conn& c, const std::string& message) {
    const Bytes text(message.begin(), message.end());
    respond(c, {c.header->op, Status::kError, 0, 0, 0}, &text);
  }

  void respond(Conn& c, const Header& h, const Bytes* value) {
    c.out = frame(h, {}, value);
    c.out_sent = 0;
    flush(c);
  }

  void flush(Conn& c) {
    while (c.out_sent < c.out.size()) {
      const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;  // the rest goes when poll says POLLOUT
      } else {
        return close_conn(c, fmt::format("send: {}", std::strerror(errno)), false);
      }
    }
    release(c.out);
    c.out_sent = 0;
  }

  void wake_waiters(const std::string& key) {
    const Bytes& value = store_.at(key);
    for (const auto& c : conns_) {
      if (!c->dead && c->parked == key) {
        c->parked.reset();
        respond(*c, {Op::kGet, Status::kOk, 0, 0, 0}, &value);
      }
    }
  }

  void expire_waiters() {
    const auto now = Clock::now();
    for (const auto& c : conns_) {
      if (!c->dead && c->parked && c->deadline <= now) {
        c->parked.reset();
        respond(*c, {Op::kGet, Status::kNotFound, 0, 0, 0}, nullptr);
      }
    }
  }

  UniqueFd listener_;
  UniqueFd wake_;
  std::string name_;
  std::map<std::string, Bytes> store_;
  std::vector<std::unique_ptr<Conn>> conns_;
  Clock::time_point accept_paused_until_{};
};

TcpStoreServer::TcpStoreServer(std::string host, std::uint16_t port) : host_(std::move(host)) {
  UniqueFd listener = listen_tcp(host_, port);
  port_ = local_port(listener.get());
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (wake.get() < 0) throw_errno("tcp store server: eventfd");
  loop_ = std::make_unique<Loop>(std::move(listener), std::move(wake), endpoint(host_, port_));
  thread_ = std::thread([loop = loop_.get()] {
    ::pthread_setname_np(::pthread_self(), "dlop-store");
    loop->run();
  });
  log().debug("tcp store: serving on {}", endpoint(host_, port_));
}

TcpStoreServer::~TcpStoreServer() {
  loop_->stop();
  thread_.join();
}

// ---------------------------------------------------------------- client ----

struct TcpStoreClient::Reply {
  Status status = Status::kOk;
  Bytes value;
  std::int64_t arg = 0;
};

TcpStoreClient::TcpStoreClient(std::string host, std::uint16_t port, std::chrono::milliseconds connect_timeout)
    : host_(std::move(host)), port_(port) {
  fd_ = connect_with_retry(host_, port_, connect_timeout).release();
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStoreClient::fail(Errc code, const std::string& what) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  throw_error(code, fmt::format("tcp store {}: {}", endpoint(host_, port_), what));
}

TcpStoreClient::Reply TcpStoreClient::call(std::uint8_t op, const std::string& key, const Bytes* value,
                                           std::int64_t arg, std::chrono::milliseconds extra_wait) {
  if (key.size() > kMaxKey) {
    throw_error(Errc::kInvalidArgument, fmt::format("tcp store: key of {} bytes is over the limit of {}", key.size(), kMaxKey));
  }
  const std::size_t value_len = value != nullptr ? value->size() : 0;
  if (value_len > kMaxValue) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("tcp store: value of {} bytes for key '{}' is over the limit of {}", value_len, key, kMaxValue));
  }
  std::lock_guard lock(mutex_);
  if (fd_ < 0) throw_error(Errc::kTransport, fmt::format("tcp store {}: connection is broken", endpoint(host_, port_)));
  const Bytes request = frame({static_cast<Op>(op), Status::kOk, 0, 0, arg}, key, value);
  const auto deadline = Clock::now() + config().timeout + extra_wait;
  auto check = [&](Io io, const char* what) {
    if (io == Io::kOk) return;
    if (io == Io::kTimeout) fail(Errc::kTimeout, fmt::format("server did not answer {} within {} ms", what,
                                                            (config().timeout + extra_wait).count()));
    if (io == Io::kClosed) fail(Errc::kTransport, fmt::format("connection closed by the server while {}", what));
    fail(Errc::kTransport, fmt::format("{}: {}", what, std::strerror(errno)));
  };
  check(send_all(fd_, request.data(), request.size(), deadline), "sending a request");
  std::uint8_t header[kHeaderSize];
  check(recv_all(fd_, header, kHeaderSize, deadline), "reading a reply");
  std::string why;
  const auto h = decode(header, false, why);
  if (!h) fail(Errc::kProtocol, "malformed reply: " + why);
  if (h->op != static_cast<Op>(op)) fail(Errc::kProtocol, "reply to a different request");
  Reply reply{h->status, Bytes(h->value_len), h->arg};
  check(recv_all(fd_, reply.value.data(), reply.value.size(), deadline), "reading a reply");
  if (reply.status == Status::kError) {
    throw_error(Errc::kProtocol, fmt::format("tcp store {} refused: {}", endpoint(host_, port_),
                                             std::string(reply.value.begin(), reply.value.end())));
  }
  return reply;
}

void TcpStoreClient::set(const std::string& key, const Bytes& value) {
  call(static_cast<std::uint8_t>(Op::kSet), key, &value, 0, {});
}

Bytes TcpStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto wait = std::clamp<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(0), kMaxWait);
  Reply reply = call(static_cast<std::uint8_t>(Op::kGet), key, nullptr, wait.count(), wait);
  if (reply.status == Status::kNotFound) {
    throw_error(Errc::kTimeout, fmt::format("tcp store {}: key '{}' not set within {} ms", endpoint(host_, port_), key,
                                            timeout.count()));
  }
  return std::move(reply.value);
}

std::int64_t TcpStoreClient::add(const std::string& key, std::int64_t delta) {
  return call(static_cast<std::uint8_t>(Op::kAdd), key, nullptr, delta, {}).arg;
}

bool TcpStoreClient::erase(const std::string& key) {
  return call(static_cast<std::uint8_t>(Op::kErase), key, nullptr, 0, {}).arg != 0;
}

std::pair<std::string, std::uint16_t> parse_host_port(const std::string& text) {
  const auto bad = [&text](const char* why) -> std::pair<std::string, std::uint16_t> {
    throw_error(Errc::kInvalidArgument, fmt::format("'{}' is not host:port: {}", text, why));
  };
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) return bad("no ':'");
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find_first_of(":[]") != std::string::npos) {
    return bad("an IPv6 address must be in brackets");
  }
  if (host.empty()) return bad("empty host");
  const char* first = text.data() + colon + 1;
  const char* last = text.data() + text.size();
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(first, last, port);
  if (first == last || ec != std::errc() || end != last || port > 65535) return bad("the port is not a number in 0..65535");
  return {host, static_cast<std::uint16_t>(port)};
}

}  // namespace dlop::transport
