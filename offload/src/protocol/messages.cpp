#include <cmath>

#include "offload/protocol_messages.hpp"
#include "wire.hpp"

namespace dlop::offload::protocol {

namespace {

template <class F>
Bytes build(F&& fill) {
  Bytes out;
  Writer w(out);
  fill(w);
  return out;
}

[[noreturn]] void bad(const std::string& what) { throw_error(Errc::kProtocol, what); }

}  // namespace

Bytes encode(const Challenge& m) { return build([&](Writer& w) { w.fixed(m.server_nonce); }); }

template <>
Challenge decode<Challenge>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Challenge m;
  m.server_nonce = r.fixed<32>();
  r.finish("CHALLENGE");
  return m;
}

Bytes encode(const Hello& m) {
  return build([&](Writer& w) {
    w.fixed(m.client_nonce);
    w.fixed(m.proof);
    w.str(m.client_name);
  });
}

template <>
Hello decode<Hello>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Hello m;
  m.client_nonce = r.fixed<32>();
  m.proof = r.fixed<32>();
  m.client_name = r.str(kMaxName);
  r.finish("HELLO");
  return m;
}

Bytes encode(const Welcome& m) {
  return build([&](Writer& w) {
    w.u32(m.threads);
    w.u32(m.pid);
    w.str(m.daemon_name);
    w.str(m.host);
    w.fixed(m.direct_nonce);
  });
}

template <>
Welcome decode<Welcome>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Welcome m;
  m.threads = r.u32();
  m.pid = r.u32();
  m.daemon_name = r.str(kMaxName);
  m.host = r.str(kMaxName);
  m.direct_nonce = r.fixed<32>();
  r.finish("WELCOME");
  return m;
}

Bytes encode(const Configure& m) {
  return build([&](Writer& w) {
    w.bytes(m.worker_address);
    w.str(m.host);
    w.str(m.source);
    w.str(m.transform);
    w.bytes(m.python);
    w.u64(m.seed);
    w.u32(m.batch_size);
    w.u32(m.pid);
    w.u64(m.proof_address);
  });
}

template <>
Configure decode<Configure>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Configure m;
  const auto address = r.bytes(kMaxAddress);
  m.worker_address.assign(address.begin(), address.end());
  m.host = r.str(kMaxName);
  m.source = r.str(kMaxPath);
  m.transform = r.str(kMaxSpec);
  const auto python = r.bytes(kMaxPython);
  m.python.assign(python.begin(), python.end());
  m.seed = r.u64();
  m.batch_size = r.u32();
  m.pid = r.u32();
  m.proof_address = r.u64();
  r.finish("CONFIGURE");
  if (m.worker_address.empty()) bad("CONFIGURE without a UCX worker address");
  if (m.batch_size == 0 || m.batch_size > kMaxBatch) bad("CONFIGURE batch size " + std::to_string(m.batch_size) + " out of range");
  return m;
}

Bytes encode(const Configured& m) {
  return build([&](Writer& w) {
    w.u64(m.dataset_size);
    w.u32(m.classes);
    w.u32(m.channels);
    w.u32(m.height);
    w.u32(m.width);
    w.u8(static_cast<std::uint8_t>(m.dtype));
    w.u64(m.sample_bytes);
    w.u64(m.labels_offset);
    w.u64(m.batch_bytes);
    w.u8(m.direct ? 1 : 0);
  });
}

template <>
Configured decode<Configured>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Configured m;
  m.dataset_size = r.u64();
  m.classes = r.u32();
  m.channels = r.u32();
  m.height = r.u32();
  m.width = r.u32();
  const std::uint8_t dtype = r.u8();
  if (dtype > 2) bad("CONFIGURED with unknown dtype " + std::to_string(dtype));
  m.dtype = Dtype{dtype};
  m.sample_bytes = r.u64();
  m.labels_offset = r.u64();
  m.batch_bytes = r.u64();
  const std::uint8_t direct = r.u8();
  if (direct > 1) bad("CONFIGURED with direct " + std::to_string(direct));
  m.direct = direct == 1;
  r.finish("CONFIGURED");
  if (m.dtype == Dtype::kPythonBlob) {
    if (m.direct || m.channels != 0 || m.height != 0 || m.width != 0 || m.sample_bytes != 0 || m.labels_offset != 0 ||
        m.batch_bytes != 0) {
      bad("CONFIGURED for the Python path with a batch layout");
    }
    return m;
  }
  // The client sizes buffers from these: they must describe one layout.
  const std::uint64_t elem = m.dtype == Dtype::kUint8 ? 1 : 4;
  if (m.channels == 0 || m.height == 0 || m.width == 0 || m.channels > 4 || m.height > 65536 || m.width > 65536 ||
      m.sample_bytes != std::uint64_t{m.channels} * m.height * m.width * elem || m.labels_offset % 8 != 0 ||
      m.batch_bytes < m.labels_offset || m.labels_offset / m.sample_bytes > kMaxBatch ||
      (m.batch_bytes - m.labels_offset) / 8 > kMaxBatch) {
    bad("CONFIGURED with an inconsistent batch layout");
  }
  return m;
}

Bytes encode(const Produce& m) {
  return build([&](Writer& w) {
    w.u64(m.lease);
    w.u64(m.epoch);
    w.u64(m.batch);
    w.u32(static_cast<std::uint32_t>(m.indices.size()));
    for (const std::uint64_t i : m.indices) w.u64(i);
    w.u64(m.address);
  });
}

template <>
Produce decode<Produce>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Produce m;
  m.lease = r.u64();
  m.epoch = r.u64();
  m.batch = r.u64();
  const std::size_t n = r.count(8);
  m.indices.resize(n);
  for (auto& i : m.indices) i = r.u64();
  m.address = r.u64();
  r.finish("PRODUCE");
  if (m.lease == 0) bad("PRODUCE with lease 0 (reserved)");
  if (n == 0 || n > kMaxBatch) bad("PRODUCE with " + std::to_string(n) + " indices");
  return m;
}

Bytes encode(const BatchReady& m) {
  return build([&](Writer& w) {
    w.u64(m.lease);
    w.u64(m.batch);
    w.u32(m.count);
    w.u64(m.bytes);
    w.u32(static_cast<std::uint32_t>(m.skipped.size()));
    for (const auto& s : m.skipped) {
      w.u64(s.index);
      w.str(s.reason);
    }
  });
}

template <>
BatchReady decode<BatchReady>(std::span<const std::uint8_t> p) {
  Reader r(p);
  BatchReady m;
  m.lease = r.u64();
  m.batch = r.u64();
  m.count = r.u32();
  m.bytes = r.u64();
  m.skipped.resize(r.count(12));
  for (auto& s : m.skipped) {
    s.index = r.u64();
    s.reason = r.str(kMaxText);
  }
  r.finish("BATCH_READY");
  if (m.count > kMaxBatch) bad("BATCH_READY with count " + std::to_string(m.count));
  return m;
}

Bytes encode(const ErrorMsg& m) {
  return build([&](Writer& w) {
    w.u64(m.lease);
    w.u32(static_cast<std::uint32_t>(m.code));
    w.str(m.message);
  });
}

template <>
ErrorMsg decode<ErrorMsg>(std::span<const std::uint8_t> p) {
  Reader r(p);
  ErrorMsg m;
  m.lease = r.u64();
  const std::uint32_t code = r.u32();
  if (code == 0 || code > kMaxErrorCode) bad("ERROR with unknown code " + std::to_string(code));
  m.code = ErrorCode{code};
  m.message = r.str(kMaxText);
  r.finish("ERROR");
  return m;
}

Bytes encode(const Cancel& m) { return build([&](Writer& w) { w.u64(m.lease); }); }

template <>
Cancel decode<Cancel>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Cancel m;
  m.lease = r.u64();
  r.finish("CANCEL");
  return m;
}

Bytes encode(const Canceled& m) { return build([&](Writer& w) { w.u64(m.lease); }); }

template <>
Canceled decode<Canceled>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Canceled m;
  m.lease = r.u64();
  r.finish("CANCELED");
  return m;
}

Bytes encode(const StatsRequest&) { return {}; }

template <>
StatsRequest decode<StatsRequest>(std::span<const std::uint8_t> p) {
  Reader(p).finish("STATS_REQUEST");
  return {};
}

Bytes encode(const Stats& m) {
  return build([&](Writer& w) {
    w.u32(static_cast<std::uint32_t>(m.stages.size()));
    for (const auto& s : m.stages) {
      w.str(s.name);
      w.u64(s.items);
      w.f64(s.seconds);
      w.u64(s.bytes);
    }
    w.u32(static_cast<std::uint32_t>(m.counters.size()));
    for (const auto& [name, value] : m.counters) {
      w.str(name);
      w.u64(value);
    }
  });
}

template <>
Stats decode<Stats>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Stats m;
  m.stages.resize(r.count(28));
  for (auto& s : m.stages) {
    s.name = r.str(kMaxName);
    s.items = r.u64();
    s.seconds = r.f64();
    s.bytes = r.u64();
    if (!std::isfinite(s.seconds) || s.seconds < 0) bad("STATS with a bad time for stage " + s.name);
  }
  m.counters.resize(r.count(12));
  for (auto& [name, value] : m.counters) {
    name = r.str(kMaxName);
    value = r.u64();
  }
  r.finish("STATS");
  return m;
}

Bytes encode(const Ping& m) { return build([&](Writer& w) { w.u64(m.token); }); }
Bytes encode(const Pong& m) { return build([&](Writer& w) { w.u64(m.token); }); }

template <>
Ping decode<Ping>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Ping m{.token = r.u64()};
  r.finish("PING");
  return m;
}

template <>
Pong decode<Pong>(std::span<const std::uint8_t> p) {
  Reader r(p);
  Pong m{.token = r.u64()};
  r.finish("PONG");
  return m;
}

void decode_any(MsgType type, std::span<const std::uint8_t> payload) {
  switch (type) {
    case MsgType::kChallenge: decode<Challenge>(payload); return;
    case MsgType::kHello: decode<Hello>(payload); return;
    case MsgType::kWelcome: decode<Welcome>(payload); return;
    case MsgType::kConfigure: decode<Configure>(payload); return;
    case MsgType::kConfigured: decode<Configured>(payload); return;
    case MsgType::kProduce: decode<Produce>(payload); return;
    case MsgType::kBatchReady: decode<BatchReady>(payload); return;
    case MsgType::kError: decode<ErrorMsg>(payload); return;
    case MsgType::kCancel: decode<Cancel>(payload); return;
    case MsgType::kCanceled: decode<Canceled>(payload); return;
    case MsgType::kStatsRequest: decode<StatsRequest>(payload); return;
    case MsgType::kStats: decode<Stats>(payload); return;
    case MsgType::kPing: decode<Ping>(payload); return;
    case MsgType::kPong: decode<Pong>(payload); return;
  }
  bad("unknown message type " + std::to_string(static_cast<unsigned>(type)));
}

}  // namespace dlop::offload::protocol
