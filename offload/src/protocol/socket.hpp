// Small POSIX socket helpers shared by the daemon and the client.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

namespace dlop::offload::net {

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Binds and listens (non-blocking) on host:port; port 0 picks one. Throws
// dlop::Error(kSystem) naming host:port.
UniqueFd listen_tcp(const std::string& host, std::uint16_t port);
std::uint16_t local_port(int fd);
// Connects (blocking, with a timeout), then makes the socket non-blocking.
// Throws kPeerDead naming host:port when nobody listens or the timeout passes.
UniqueFd connect_tcp(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout);
// TCP_NODELAY (control frames are small and latency matters) and keepalive
// probes that notice a vanished peer host within about 20 s.
void tune_socket(int fd);
// "ip:port" of the socket's peer.
std::string peer_name(int fd);
// Milliseconds until `deadline` for poll(), at least 0, -1 for none.
int poll_ms(std::chrono::steady_clock::time_point deadline);

}  // namespace dlop::offload::net
