// Private to tcp_store.cpp: the TCP store's wire format, and the socket
// helpers its server and client share.
//
// Every message, request or response, starts with a 24-byte header, all
// integers little-endian:
//
//   offset  size  field
//        0     4  magic      0x54534c44 ("DLST" as bytes)
//        4     2  version    kVersion
//        6     1  op         Op (a response echoes its request's op)
//        7     1  status     0 in requests; Status in responses
//        8     4  key_len    bytes of key that follow the header (0 in responses)
//       12     4  value_len  bytes of value that follow the key (requests: SET only)
//       16     8  arg        GET: timeout in ms; ADD: delta;
//                            response: ADD's new value, ERASE's 1/0
//
// A header that is not understood or announces more than kMaxKey / kMaxValue
// bytes ends the connection: lengths come from the network and are not trusted.
#pragma once

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "transport/tcp_store.hpp"

namespace dlop::transport::tcp_store_detail {

inline constexpr std::uint32_t kMagic = 0x54534c44;
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kHeaderSize = 24;
inline constexpr std::size_t kMaxKey = kTcpStoreMaxKey;
inline constexpr std::size_t kMaxValue = kTcpStoreMaxValue;

enum class Op : std::uint8_t { kSet = 1, kGet = 2, kAdd = 3, kErase = 4 };
// kError carries a message as its value.
enum class Status : std::uint8_t { kOk = 0, kNotFound = 1, kError = 2 };

struct Header {
  Op op = Op::kSet;
  Status status = Status::kOk;
  std::uint32_t key_len = 0;
  std::uint32_t value_len = 0;
  std::int64_t arg = 0;
};

namespace wire {

template <typename T>
void put(std::uint8_t* out, T value) {
  using U = std::make_unsigned_t<T>;
  auto bits = static_cast<U>(value);
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<std::uint8_t>(bits & 0xffU);
    bits = static_cast<U>(bits >> 8U);
  }
}

template <typename T>
T get(const std::uint8_t* in) {
  using U = std::make_unsigned_t<T>;
  U bits = 0;
  for (std::size_t i = sizeof(T); i-- > 0;) bits = static_cast<U>((bits << 8U) | in[i]);
  return static_cast<T>(bits);
}

}  // namespace wire

inline void encode(const Header& h, std::uint8_t* out) {
  wire::put<std::uint32_t>(out + 0, kMagic);
  wire::put<std::uint16_t>(out + 4, kVersion);
  out[6] = static_cast<std::uint8_t>(h.op);
  out[7] = static_cast<std::uint8_t>(h.status);
  wire::put<std::uint32_t>(out + 8, h.key_len);
  wire::put<std::uint32_t>(out + 12, h.value_len);
  wire::put<std::int64_t>(out + 16, h.arg);
}

// A whole message: the header (its lengths filled in), key and value.
inline Bytes frame(Header h, std::string_view key, const Bytes* value) {
  h.key_len = static_cast<std::uint32_t>(key.size());
  h.value_len = value != nullptr ? static_cast<std::uint32_t>(value->size()) : 0;
  Bytes out(kHeaderSize + h.key_len + h.value_len);
  encode(h, out.data());
  std::copy(key.begin(), key.end(), out.begin() + kHeaderSize);
  if (value != nullptr) std::copy(value->begin(), value->end(), out.begin() + static_cast<std::ptrdiff_t>(kHeaderSize + h.key_len));
  return out;
}

// The value of an ADD key: decimal text, as FileStore keeps it.
inline bool parse_decimal(const Bytes& text, std::int64_t& value) {
  const char* first = reinterpret_cast<const char*>(text.data());
  const char* last = first + text.size();
  const auto [end, ec] = std::from_chars(first, last, value);
  return first != last && ec == std::errc() && end == last;
}

// Decodes and validates a header; on failure returns nullopt and says why.
inline std::optional<Header> decode(const std::uint8_t* in, bool is_request, std::string& why) {
  Header h;
  const auto magic = wire::get<std::uint32_t>(in + 0);
  const auto version = wire::get<std::uint16_t>(in + 4);
  const std::uint8_t op = in[6];
  const std::uint8_t status = in[7];
  h.key_len = wire::get<std::uint32_t>(in + 8);
  h.value_len = wire::get<std::uint32_t>(in + 12);
  h.arg = wire::get<std::int64_t>(in + 16);
  if (magic != kMagic) {
    why = fmt::format("bad magic {:#010x}", magic);
  } else if (version != kVersion) {
    why = fmt::format("unsupported version {}", version);
  } else if (op < static_cast<std::uint8_t>(Op::kSet) || op > static_cast<std::uint8_t>(Op::kErase)) {
    why = fmt::format("unknown op {}", op);
  } else if (status > static_cast<std::uint8_t>(Status::kError) || (is_request && status != 0)) {
    why = fmt::format("bad status {}", status);
  } else if (h.key_len > kMaxKey || (!is_request && h.key_len != 0)) {
    why = fmt::format("key length {} over the limit of {}", h.key_len, kMaxKey);
  } else if (is_request && op != static_cast<std::uint8_t>(Op::kSet) && h.value_len != 0) {
    why = fmt::format("op {} carries a value", op);
  } else if (h.value_len > kMaxValue) {
    why = fmt::format("value length {} over the limit of {}", h.value_len, kMaxValue);
  } else {
    h.op = static_cast<Op>(op);
    h.status = static_cast<Status>(status);
    return h;
  }
  return std::nullopt;
}

using Clock = std::chrono::steady_clock;

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Milliseconds left until deadline for poll(): rounded up, at least 0.
inline int poll_timeout(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 24LL * 3600 * 1000));
}

enum class Io { kOk, kTimeout, kClosed, kError };  // kError leaves errno set

// Blocking-style I/O on a non-blocking socket, bounded by a deadline.
inline Io send_all(int fd, const std::uint8_t* data, std::size_t size, Clock::time_point deadline) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno == EPIPE || errno == ECONNRESET ? Io::kClosed : Io::kError;
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, poll_timeout(deadline));
    if (ready == 0) return Io::kTimeout;
    if (ready < 0 && errno != EINTR) return Io::kError;
  }
  return Io::kOk;
}

inline Io recv_all(int fd, std::uint8_t* data, std::size_t size, Clock::time_point deadline) {
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
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, poll_timeout(deadline));
    if (ready == 0) return Io::kTimeout;
    if (ready < 0 && errno != EINTR) return Io::kError;
  }
  return Io::kOk;
}

inline std::string endpoint(const std::string& host, std::uint16_t port) {
  return host.find(':') == std::string::npos ? fmt::format("{}:{}", host, port) : fmt::format("[{}]:{}", host, port);
}

// Owns getaddrinfo()'s list.
struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list != nullptr) ::freeaddrinfo(list);
  }
};

// Resolves host:port; on failure returns a message in `why`.
inline bool resolve(const std::string& host, std::uint16_t port, bool passive, AddrInfo& out, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &out.list);
  if (rc != 0) why = fmt::format("cannot resolve {}: {}", host, ::gai_strerror(rc));
  return rc == 0;
}

inline void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

inline std::string peer_name(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "unknown peer";
  }
  return fmt::format("{}:{}", host, serv);
}

// One attempt to connect within the deadline; -1 with `why` on failure.
inline int try_connect(const std::string& host, std::uint16_t port, Clock::time_point deadline, std::string& why) {
  AddrInfo addrs;
  if (!resolve(host, port, false, addrs, why)) return -1;
  for (const addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      why = fmt::format("socket: {}", std::strerror(errno));
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        why = std::strerror(errno);
        continue;
      }
      pollfd p{fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, poll_timeout(deadline)) <= 0) {
        why = "connect timed out";
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
    return fd.release();
  }
  return -1;
}

// Connects to host:port, retrying until connect_timeout passes (the server
// may start later); then throws dlop::Error(kTimeout) naming host:port.
inline UniqueFd connect_with_retry(const std::string& host, std::uint16_t port, std::chrono::milliseconds connect_timeout) {
  const auto deadline = Clock::now() + connect_timeout;
  auto pause = std::chrono::milliseconds(5);
  std::string why;
  while (true) {
    UniqueFd fd(try_connect(host, port, deadline, why));
    if (fd.get() >= 0) {
      set_nodelay(fd.get());
      return fd;
    }
    if (Clock::now() >= deadline) {
      throw_error(Errc::kTimeout, fmt::format("tcp store: cannot connect to {} within {} ms: {}", endpoint(host, port),
                                              connect_timeout.count(), why));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

// A listening socket on host:port (0: ephemeral); sets the port bound.
// Throws dlop::Error(kSystem) naming host:port.
inline UniqueFd listen_on(const std::string& host, std::uint16_t port, std::uint16_t& bound_port) {
  AddrInfo addrs;
  std::string why;
  if (!resolve(host, port, true, addrs, why)) throw_error(Errc::kSystem, fmt::format("tcp store server: {}", why));
  UniqueFd listener;
  for (const addrinfo* a = addrs.list; a != nullptr && listener.get() < 0; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    const int one = 1;
    if (fd.get() >= 0 && ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        ::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), SOMAXCONN) == 0) {
      listener = std::move(fd);
    } else {
      why = std::strerror(errno);
    }
  }
  if (listener.get() < 0) {
    throw_error(Errc::kSystem, fmt::format("tcp store server: cannot listen on {}: {}", endpoint(host, port), why));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) throw_errno("getsockname");
  bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  return listener;
}

}  // namespace dlop::transport::tcp_store_detail
