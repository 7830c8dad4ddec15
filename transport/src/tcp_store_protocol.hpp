// Private to tcp_store.cpp: the TCP store's wire format, and how its client
// connects (over the socket layer, transport/socket.hpp).
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

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include "transport/socket.hpp"
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

using net::Clock;
using net::UniqueFd;

// Connects to host:port, retrying until connect_timeout passes (the server
// may start later); then throws dlop::Error(kTimeout) naming host:port.
inline UniqueFd connect_with_retry(const std::string& host, std::uint16_t port, std::chrono::milliseconds connect_timeout) {
  const auto deadline = Clock::now() + connect_timeout;
  auto pause = std::chrono::milliseconds(5);
  std::string why;
  while (true) {
    UniqueFd fd = net::try_connect(host, port, deadline, why);
    if (fd) {
      net::tune_socket(fd.get());
      return fd;
    }
    if (Clock::now() >= deadline) {
      throw_error(Errc::kTimeout, fmt::format("tcp store: cannot connect to {} within {} ms: {}", net::endpoint(host, port),
                                              connect_timeout.count(), why));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace dlop::transport::tcp_store_detail
