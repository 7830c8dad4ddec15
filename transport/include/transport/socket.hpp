// The POSIX TCP socket layer: an owned descriptor, listening, connecting,
// deadline-bounded I/O. One layer for every TCP connection dlop makes: the
// TCP store (tcp_store.hpp) and the offload control connection alike.
//
// Sockets made here are non-blocking and close-on-exec. Errors name the
// address or peer they concern, as host:port ([host]:port for IPv6).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace dlop::transport::net {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor: closes it on destruction or reset().
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// "host:port", or "[host]:port" for an IPv6 literal.
std::string endpoint(const std::string& host, std::uint16_t port);

// Binds and listens on host:port ("" or "0.0.0.0": every interface; port 0:
// an ephemeral one, see local_port). Throws dlop::Error(kSystem) naming
// host:port when the name does not resolve or nothing can be bound.
UniqueFd listen_tcp(const std::string& host, std::uint16_t port);
// The port a socket is bound to.
std::uint16_t local_port(int fd);

// One attempt to connect to host:port, each resolved address tried in turn
// until `deadline`. On failure returns an empty UniqueFd and sets `why` (the
// last address's reason, or the resolver's). The caller decides whether to
// retry and which error to raise: a store may start after its clients, a
// dead daemon should be reported at once.
UniqueFd try_connect(const std::string& host, std::uint16_t port, Clock::time_point deadline, std::string& why);

// TCP_NODELAY (dlop's control messages are small and latency matters) and
// keepalive probes that notice a vanished peer host within about 20 s.
void tune_socket(int fd);
// "ip:port" of the socket's peer, "unknown peer" when it has none.
std::string peer_name(int fd);

// Milliseconds until `deadline` for poll(): rounded up, at least 0; -1 (wait
// forever) for Clock::time_point::max().
int poll_ms(Clock::time_point deadline);

enum class Io { kOk, kTimeout, kClosed, kError };  // kError leaves errno set

// Sends or receives exactly `size` bytes on a non-blocking socket, waiting in
// poll() no later than `deadline`. A reset or closed peer is kClosed.
Io send_all(int fd, const std::uint8_t* data, std::size_t size, Clock::time_point deadline);
Io recv_all(int fd, std::uint8_t* data, std::size_t size, Clock::time_point deadline);

}  // namespace dlop::transport::net
