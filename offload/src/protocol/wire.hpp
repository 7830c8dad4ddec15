// Little-endian field writers and bounds-checked readers for the offload
// protocol. A Reader never reads past its span: every overrun, oversized
// count or trailing byte is a dlop::Error(kProtocol).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace dlop::offload::protocol {

class Writer {
 public:
  explicit Writer(std::vector<std::uint8_t>& out) : out_(out) {}
  void u8(std::uint8_t v) { out_.push_back(v); }
  void u16(std::uint16_t v) { le(v, 2); }
  void u32(std::uint32_t v) { le(v, 4); }
  void u64(std::uint64_t v) { le(v, 8); }
  void f64(double v) { u64(std::bit_cast<std::uint64_t>(v)); }
  void bytes(std::span<const std::uint8_t> b) {
    u32(static_cast<std::uint32_t>(b.size()));
    out_.insert(out_.end(), b.begin(), b.end());
  }
  void str(const std::string& s) {
    bytes(std::span(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
  }
  template <std::size_t N>
  void fixed(const std::array<std::uint8_t, N>& a) {
    out_.insert(out_.end(), a.begin(), a.end());
  }

 private:
  void le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  std::vector<std::uint8_t>& out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> in) : in_(in) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(le(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(le(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(le(4)); }
  std::uint64_t u64() { return le(8); }
  double f64() { return std::bit_cast<double>(u64()); }
  std::span<const std::uint8_t> bytes(std::size_t max) {
    const std::uint32_t n = u32();
    if (n > max) throw_error(Errc::kProtocol, "field of " + std::to_string(n) + " bytes over its limit of " + std::to_string(max));
    return take(n);
  }
  std::string str(std::size_t max) {
    const auto b = bytes(max);
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  template <std::size_t N>
  std::array<std::uint8_t, N> fixed() {
    std::array<std::uint8_t, N> a{};
    const auto b = take(N);
    std::memcpy(a.data(), b.data(), N);
    return a;
  }
  // A count of items each at least `min_item_bytes` long: refused when the
  // rest of the payload could not hold them, so a forged count never makes
  // the receiver allocate.
  std::size_t count(std::size_t min_item_bytes) {
    const std::uint32_t n = u32();
    if (min_item_bytes > 0 && n > remaining() / min_item_bytes) {
      throw_error(Errc::kProtocol, "count " + std::to_string(n) + " larger than the payload can hold");
    }
    return n;
  }
  std::size_t remaining() const { return in_.size() - pos_; }
  // Every message must use its whole payload.
  void finish(const char* what) const {
    if (pos_ != in_.size()) {
      throw_error(Errc::kProtocol, std::string(what) + ": " + std::to_string(in_.size() - pos_) + " trailing bytes");
    }
  }

 private:
  std::span<const std::uint8_t> take(std::size_t n) {
    if (n > remaining()) throw_error(Errc::kProtocol, "message truncated: " + std::to_string(n) + " bytes needed, " + std::to_string(remaining()) + " left");
    const auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::uint64_t le(int n) {
    const auto b = take(static_cast<std::size_t>(n));
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t{b[static_cast<std::size_t>(i)]} << (8 * i);
    return v;
  }
  std::span<const std::uint8_t> in_;
  std::size_t pos_ = 0;
};

}  // namespace dlop::offload::protocol
