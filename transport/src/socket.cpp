#include "transport/socket.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace dlop::transport::net {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

// Owns getaddrinfo()'s list.
struct AddrInfo {
  addrinfo* list = nullptr;
  AddrInfo() = default;
  AddrInfo(const AddrInfo&) = delete;
  AddrInfo& operator=(const AddrInfo&) = delete;
  ~AddrInfo() {
    if (list != nullptr) ::freeaddrinfo(list);
  }
};

// Resolves host:port ("" is every interface when passive, loopback otherwise);
// on failure returns false and says why.
bool resolve(const std::string& host, std::uint16_t port, bool passive, AddrInfo& out, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out.list);
  if (rc != 0) why = fmt::format("cannot resolve {}: {}", endpoint(host, port), ::gai_strerror(rc));
  return rc == 0;
}

UniqueFd open_socket(const addrinfo& a) {
  return UniqueFd(::socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.ai_protocol));
}

}  // namespace

std::string endpoint(const std::string& host, std::uint16_t port) {
  return host.find(':') == std::string::npos ? fmt::format("{}:{}", host, port) : fmt::format("[{}]:{}", host, port);
}

UniqueFd listen_tcp(const std::string& host, std::uint16_t port) {
  AddrInfo addrs;
  std::string why = "no address";
  if (!resolve(host, port, true, addrs, why)) throw_error(Errc::kSystem, why);
  for (const addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
    UniqueFd fd = open_socket(*a);
    const int one = 1;
    if (fd && ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        ::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), SOMAXCONN) == 0) {
      return fd;
    }
    why = std::strerror(errno);
  }
  throw_error(Errc::kSystem, fmt::format("cannot listen on {}: {}", endpoint(host, port), why));
}

std::uint16_t local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) throw_errno("getsockname");
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
}

UniqueFd try_connect(const std::string& host, std::uint16_t port, Clock::time_point deadline, std::string& why) {
  AddrInfo addrs;
  why = "no address";
  if (!resolve(host, port, false, addrs, why)) return {};
  for (const addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
    UniqueFd fd = open_socket(*a);
    if (!fd) {
      why = fmt::format("socket: {}", std::strerror(errno));
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        why = std::strerror(errno);
        continue;
      }
      pollfd p{fd.get(), POLLOUT, 0};
      const int ready = ::poll(&p, 1, poll_ms(deadline));
      if (ready <= 0) {
        why = ready == 0 ? "connect timed out" : std::strerror(errno);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        why = std::strerror(err);
        continue;
      }
    }
    return fd;
  }
  return {};
}

void tune_socket(int fd) {
  const int one = 1, idle = 10, interval = 3, count = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  char host[NI_MAXHOST] = {};
  char serv[NI_MAXSERV] = {};
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "unknown peer";
  }
  return fmt::format("{}:{}", host, serv);
}

int poll_ms(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1LL << 30));
}

namespace {

// Waits until fd is ready for `events` or the deadline passes.
Io wait_ready(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  const int ready = ::poll(&p, 1, poll_ms(deadline));
  if (ready == 0) return Io::kTimeout;
  if (ready < 0 && errno != EINTR) return Io::kError;
  return Io::kOk;
}

}  // namespace

Io send_all(int fd, const std::uint8_t* data, std::size_t size, Clock::time_point deadline) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno == EPIPE || errno == ECONNRESET ? Io::kClosed : Io::kError;
    if (const Io io = wait_ready(fd, POLLOUT, deadline); io != Io::kOk) return io;
  }
  return Io::kOk;
}

Io recv_all(int fd, std::uint8_t* data, std::size_t size, Clock::time_point deadline) {
  while (size > 0) {
    const ssize_t n = ::recv(fd, data, size, 0);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return Io::kClosed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno == ECONNRESET ? Io::kClosed : Io::kError;
    if (const Io io = wait_ready(fd, POLLIN, deadline); io != Io::kOk) return io;
  }
  return Io::kOk;
}

}  // namespace dlop::transport::net
