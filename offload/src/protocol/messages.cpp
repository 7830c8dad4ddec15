// Encoding and decoding of every message, from its fields() table: the
// encoder and the decoder walk the same list, so they cannot disagree.
#include <cmath>
#include <type_traits>

#include "offload/protocol_messages.hpp"
#include "wire.hpp"

namespace dlop::offload::protocol {

namespace {

[[noreturn]] void bad(const std::string& what) { throw_error(Errc::kProtocol, what); }

template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};

// An integer of the wire's sizes (bool is one byte, 0 or 1; enums travel as
// their underlying type).
template <class T>
concept WireInt = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// A list's items are a message-like struct (its fields()), a STATS counter
// (a name then a value) or a plain value.
template <class Item, class V>
void visit_item(Item& item, V& v) {
  using T = std::remove_const_t<Item>;
  if constexpr (requires { T::fields(item, v); }) {
    T::fields(item, v);
  } else if constexpr (std::is_same_v<T, std::pair<std::string, std::uint64_t>>) {
    v("name", item.first, kMaxName);
    v("value", item.second);
  } else {
    v("item", item);
  }
}

// The fewest bytes one list item takes: a count that the rest of a payload
// could not hold is refused before anything is allocated.
class MinBytes {
 public:
  template <class T>
  void operator()(std::string_view, const T&) {
    if constexpr (std::is_same_v<T, bool>) {
      n += 1;
    } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
      n += sizeof(T);
    } else if constexpr (IsVector<T>::value) {
      n += 4;
    } else {
      n += std::tuple_size_v<T>;  // a fixed array of bytes
    }
  }
  template <class T, class Limit>
  void operator()(std::string_view, const T&, Limit) {
    n += std::is_enum_v<T> ? sizeof(T) : 4;  // an enum, or a length-prefixed string
  }
  std::size_t n = 0;
};

template <class Item>
std::size_t min_bytes() {
  MinBytes m;
  const Item item{};
  visit_item(item, m);
  return m.n;
}

class Encoder {
 public:
  explicit Encoder(Bytes& out) : w_(out) {}
  template <class T>
  void operator()(std::string_view, const T& value) {
    if constexpr (std::is_same_v<T, bool>) {
      w_.u8(value ? 1 : 0);
    } else if constexpr (WireInt<T>) {
      integer(value);
    } else if constexpr (std::is_same_v<T, double>) {
      w_.f64(value);
    } else if constexpr (IsVector<T>::value) {
      w_.u32(static_cast<std::uint32_t>(value.size()));
      for (const auto& item : value) visit_item(item, *this);
    } else {
      w_.fixed(value);
    }
  }
  // A string or byte string (its length limit is the decoder's), or an enum.
  void operator()(std::string_view, const std::string& s, std::size_t) { w_.str(s); }
  void operator()(std::string_view, const Bytes& b, std::size_t) { w_.bytes(b); }
  template <class E>
    requires std::is_enum_v<E>
  void operator()(std::string_view, E e, Range) {
    integer(static_cast<std::underlying_type_t<E>>(e));
  }

 private:
  template <class T>
  void integer(T v) {
    if constexpr (sizeof(T) == 1) {
      w_.u8(v);
    } else if constexpr (sizeof(T) == 2) {
      w_.u16(v);
    } else if constexpr (sizeof(T) == 4) {
      w_.u32(v);
    } else {
      static_assert(sizeof(T) == 8);
      w_.u64(v);
    }
  }
  Writer w_;
};

class Decoder {
 public:
  Decoder(std::span<const std::uint8_t> in, std::string_view message) : r_(in), message_(message) {}
  template <class T>
  void operator()(std::string_view name, T& value) {
    if constexpr (std::is_same_v<T, bool>) {
      const std::uint8_t b = r_.u8();
      if (b > 1) bad(std::string(message_) + " with " + std::string(name) + " " + std::to_string(b));
      value = b == 1;
    } else if constexpr (WireInt<T>) {
      value = integer<T>();
    } else if constexpr (std::is_same_v<T, double>) {
      value = r_.f64();
    } else if constexpr (IsVector<T>::value) {
      value.resize(r_.count(min_bytes<typename T::value_type>()));
      for (auto& item : value) visit_item(item, *this);
    } else {
      value = r_.fixed<std::tuple_size_v<T>>();
    }
  }
  void operator()(std::string_view, std::string& s, std::size_t limit) { s = r_.str(limit); }
  void operator()(std::string_view, Bytes& b, std::size_t limit) {
    const auto span = r_.bytes(limit);
    b.assign(span.begin(), span.end());
  }
  template <class E>
    requires std::is_enum_v<E>
  void operator()(std::string_view name, E& e, Range range) {
    const auto v = integer<std::underlying_type_t<E>>();
    if (v < range.lo || v > range.hi) {
      bad(std::string(message_) + " with unknown " + std::string(name) + " " + std::to_string(v));
    }
    e = E{v};
  }
  void finish() const { r_.finish(std::string(message_).c_str()); }

 private:
  template <class T>
  T integer() {
    if constexpr (sizeof(T) == 1) {
      return r_.u8();
    } else if constexpr (sizeof(T) == 2) {
      return r_.u16();
    } else if constexpr (sizeof(T) == 4) {
      return r_.u32();
    } else {
      static_assert(sizeof(T) == 8);
      return r_.u64();
    }
  }
  Reader r_;
  std::string_view message_;
};

}  // namespace

template <Message M>
Bytes encode(const M& m) {
  Bytes out;
  Encoder e(out);
  M::fields(m, e);
  return out;
}

template <Message M>
M decode(std::span<const std::uint8_t> payload) {
  Decoder d(payload, type_name(M::kType));
  M m;
  M::fields(m, d);
  d.finish();
  if constexpr (requires { m.check(); }) m.check();
  return m;
}

// Checks beyond each field's own limits.

void Configure::check() const {
  if (worker_address.empty()) bad("CONFIGURE without a UCX worker address");
  if (batch_size == 0 || batch_size > kMaxBatch) bad("CONFIGURE batch size " + std::to_string(batch_size) + " out of range");
  if (piece_bytes != 0 && piece_bytes < kMinPieceBytes) {
    bad("CONFIGURE piece size " + std::to_string(piece_bytes) + " below " + std::to_string(kMinPieceBytes) + " bytes");
  }
}

void Configured::check() const {
  if (dtype == Dtype::kPythonBlob) {
    if (direct || !shape.empty() || sample_bytes != 0 || labels_offset != 0 || lengths_offset != 0 ||
        batch_bytes != 0) {
      bad("CONFIGURED for the Python path with a batch layout");
    }
    return;
  }
  // The client sizes buffers from these: they must describe one layout, and
  // no product or offset may overflow.
  const std::uint64_t elem = dtype == Dtype::kUint8 ? 1 : 4;
  std::uint64_t elements = 1;
  bool dims_ok = !shape.empty() && shape.size() <= kMaxDims;
  for (const std::uint32_t d : shape) {
    dims_ok = dims_ok && d > 0 && d <= (1u << 24) && elements <= (std::uint64_t{1} << 40) / d;
    if (dims_ok) elements *= d;
  }
  if (!dims_ok || sample_bytes != elements * elem || label_width == 0 || label_width > (1u << 16) ||
      labels_offset % 8 != 0 || lengths_offset % 8 != 0 || labels_offset / sample_bytes > kMaxBatch) {
    bad("CONFIGURED with an inconsistent batch layout");
  }
  // Room for one sample at least; the client checks its batch size fits.
  if ((lengths_offset != 0 && lengths_offset < labels_offset + label_width * 8) || batch_bytes < bytes_for(1) ||
      (batch_bytes - labels_offset) / 8 > std::uint64_t{kMaxBatch} * ((1u << 16) + 1)) {
    bad("CONFIGURED with an inconsistent batch layout");
  }
}

void Produce::check() const {
  if (lease == 0) bad("PRODUCE with lease 0 (reserved)");
  if (indices.empty() || indices.size() > kMaxBatch) bad("PRODUCE with " + std::to_string(indices.size()) + " indices");
}

void BatchReady::check() const {
  if (count > kMaxBatch) bad("BATCH_READY with count " + std::to_string(count));
  if (!(busy >= 0 && busy <= 1)) bad("BATCH_READY with busy fraction " + std::to_string(busy) + ", not in [0, 1]");
}

void Stats::check() const {
  for (const StageStats& s : stages) {
    if (!std::isfinite(s.seconds) || s.seconds < 0) bad("STATS with a bad time for stage " + s.name);
  }
}

// Every message. A new one: its struct with fields() (protocol_messages.hpp),
// its MsgType and type_name (protocol.hpp, frame.cpp), and a line here.
#define DLOP_OFFLOAD_MESSAGES(X) \
  X(Challenge)                   \
  X(Hello)                       \
  X(Welcome)                     \
  X(Configure)                   \
  X(Configured)                  \
  X(Produce)                     \
  X(BatchReady)                  \
  X(ErrorMsg)                    \
  X(Cancel)                      \
  X(Canceled)                    \
  X(StatsRequest)                \
  X(Stats)                       \
  X(Ping)                        \
  X(Pong)

#define DLOP_INSTANTIATE(M)               \
  template Bytes encode<M>(const M& m); \
  template M decode<M>(std::span<const std::uint8_t> payload);
DLOP_OFFLOAD_MESSAGES(DLOP_INSTANTIATE)
#undef DLOP_INSTANTIATE

void decode_any(MsgType type, std::span<const std::uint8_t> payload) {
#define DLOP_DECODE_CASE(M) \
  case M::kType:            \
    decode<M>(payload);     \
    return;
  switch (type) { DLOP_OFFLOAD_MESSAGES(DLOP_DECODE_CASE) }
#undef DLOP_DECODE_CASE
  bad("unknown message type " + std::to_string(static_cast<unsigned>(type)));
}

}  // namespace dlop::offload::protocol
