// The messages of the offload protocol (payloads of the frames in
// protocol.hpp). Each struct names its MsgType and lists its fields once, in
// wire order, in fields(m, v): v(name, field) for numbers, bools and fixed
// byte arrays, v(name, field, max_length) for strings and byte strings,
// v(name, field, Range{lo, hi}) for enums, v(name, list) for lists. encode()
// and decode<M>() both walk that list; decode<M>() throws
// dlop::Error(kProtocol) on anything truncated, oversized, out of range or
// followed by trailing bytes, then runs the message's check() if it has one.
//
// Encoding: integers little-endian; strings and byte strings as a u32 length
// then the bytes; lists as a u32 count then the items; doubles as their
// IEEE-754 bits in a u64.
//
// A conversation:
//   daemon: CHALLENGE(server nonce)          client: HELLO(client nonce, proof)
//   daemon: WELCOME                          (every later frame under the session keys)
//   client: CONFIGURE                        daemon: CONFIGURED or ERROR(lease 0)
//   client: PRODUCE(lease, ...) ...          daemon: BATCH_READY(lease) or ERROR(lease), each lease once
//   client: CANCEL(lease)                    daemon: CANCELED(lease), unless its answer went out first
//   client: STATS_REQUEST, PING              daemon: STATS, PONG
#pragma once

#include <array>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "offload/protocol.hpp"

namespace dlop::offload::protocol {

using Nonce = std::array<std::uint8_t, 32>;
using Digest = std::array<std::uint8_t, 32>;

// Limits on fields, checked when decoding.
inline constexpr std::size_t kMaxName = 256;          // client and daemon names, stage names
inline constexpr std::size_t kMaxPath = 4096;         // source paths
inline constexpr std::size_t kMaxSpec = 64 * 1024;    // transform spec JSON
inline constexpr std::size_t kMaxAddress = 64 * 1024; // UCX worker address
inline constexpr std::size_t kMaxText = 4096;         // error messages, skip reasons
inline constexpr std::uint32_t kMaxBatch = 1u << 20;  // samples per batch
inline constexpr std::uint64_t kMinPieceBytes = 64u << 10;  // CONFIGURE's piece_bytes, unless 0
inline constexpr std::size_t kMaxPython = 15u << 20;  // a pickled Dataset + collate_fn (the frame holds 16 MiB)

// The values an enum field may take on the wire.
struct Range {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
};

struct Challenge {
  static constexpr MsgType kType = MsgType::kChallenge;
  Nonce server_nonce{};
  static void fields(auto& m, auto& v) { v("server_nonce", m.server_nonce); }
  bool operator==(const Challenge&) const = default;
};

struct Hello {
  static constexpr MsgType kType = MsgType::kHello;
  Nonce client_nonce{};
  Digest proof{};            // hello_proof(token, server nonce, client nonce)
  std::string client_name;   // for the daemon's logs
  static void fields(auto& m, auto& v) {
    v("client_nonce", m.client_nonce);
    v("proof", m.proof);
    v("client_name", m.client_name, kMaxName);
  }
  bool operator==(const Hello&) const = default;
};

struct Welcome {
  static constexpr MsgType kType = MsgType::kWelcome;
  std::uint32_t threads = 0;  // the daemon's compute threads
  std::uint32_t pid = 0;
  std::string daemon_name;    // host and version, for the client's logs
  std::string host;           // the daemon's host_identity(): with pid, tells the client when it is gone
  Nonce direct_nonce{};       // a same-host client proves its pid by holding this in its memory (CONFIGURE)
  static void fields(auto& m, auto& v) {
    v("threads", m.threads);
    v("pid", m.pid);
    v("daemon_name", m.daemon_name, kMaxName);
    v("host", m.host, kMaxName);
    v("direct_nonce", m.direct_nonce);
  }
  bool operator==(const Welcome&) const = default;
};

struct Configure {
  static constexpr MsgType kType = MsgType::kConfigure;
  Bytes worker_address;       // the client's UCX worker: batches are sent there
  std::string host;           // the client's host_identity(): equal to the daemon's means shared memory
  std::string source;         // native: an image folder or a record file, as the daemon sees it
  std::string transform;      // native: TransformSpec JSON (its "on_error" is the error policy)
  Bytes python;               // non-empty: the generic Python path (dlop.data._python_job), source and transform unused
  std::uint64_t seed = 0;
  std::uint32_t batch_size = 0;  // the most samples a PRODUCE may ask for
  // Native path, same host: the client's pid and the address in it where it
  // holds WELCOME's direct_nonce; the daemon reads it there (cross-memory
  // attach) before it writes batches into that process. 0: over UCX only.
  std::uint32_t pid = 0;
  std::uint64_t proof_address = 0;
  // Batches over UCX travel in pieces of this many bytes, each its own tagged
  // message (ucx_batches.hpp), so that a trainer pacing its data can hold back
  // the pieces that have not started. 0: one message per batch.
  std::uint64_t piece_bytes = 0;
  static void fields(auto& m, auto& v) {
    v("worker_address", m.worker_address, kMaxAddress);
    v("host", m.host, kMaxName);
    v("source", m.source, kMaxPath);
    v("transform", m.transform, kMaxSpec);
    v("python", m.python, kMaxPython);
    v("seed", m.seed);
    v("batch_size", m.batch_size);
    v("pid", m.pid);
    v("proof_address", m.proof_address);
    v("piece_bytes", m.piece_bytes);
  }
  void check() const;
  bool operator==(const Configure&) const = default;
};

// kPythonBlob: the generic Python path. Batches are blobs of varying size
// (dlop.data._python_job) and every size field of the layout is 0; BATCH_READY
// comes before the data and gives its size, and the client posts its receive
// then.
enum class Dtype : std::uint8_t { kFloat32 = 0, kUint8 = 1, kPythonBlob = 2 };
inline constexpr std::uint8_t kMaxDtype = 2;

// The layout of one batch in the client's buffer, for count <= batch_size
// samples (the BATCH_READY's count): samples (count x shape of dtype) from
// offset 0, labels (count x label_width int64) from labels_offset, and where
// lengths_offset is not 0, lengths (count int64) from there. batch_bytes is
// the buffer size PRODUCE needs; a batch of count samples sends its first
// bytes_for(count) bytes.
struct Configured {
  static constexpr MsgType kType = MsgType::kConfigured;
  static constexpr std::size_t kMaxDims = 6;
  std::uint64_t dataset_size = 0;
  std::uint32_t classes = 0;
  std::vector<std::uint32_t> shape;  // of one sample: {3, H, W}, {views, C, T, H, W}, {mels, frames}, ...
  Dtype dtype = Dtype::kFloat32;
  std::uint64_t sample_bytes = 0;
  std::uint32_t label_width = 1;
  std::uint64_t labels_offset = 0;
  std::uint64_t lengths_offset = 0;
  std::uint64_t batch_bytes = 0;
  bool direct = false;  // the daemon writes batches straight into the addresses PRODUCE names
  static void fields(auto& m, auto& v) {
    v("dataset_size", m.dataset_size);
    v("classes", m.classes);
    v("shape", m.shape);
    v("dtype", m.dtype, Range{0, kMaxDtype});
    v("sample_bytes", m.sample_bytes);
    v("label_width", m.label_width);
    v("labels_offset", m.labels_offset);
    v("lengths_offset", m.lengths_offset);
    v("batch_bytes", m.batch_bytes);
    v("direct", m.direct);
  }
  void check() const;
  std::uint64_t bytes_for(std::uint64_t count) const {
    return lengths_offset != 0 ? lengths_offset + count * 8 : labels_offset + count * label_width * 8;
  }
  bool operator==(const Configured&) const = default;
};

struct Produce {
  static constexpr MsgType kType = MsgType::kProduce;
  std::uint64_t lease = 0;    // nonzero, unique among the client's open leases; also the UCX tag
  std::uint64_t epoch = 0;
  std::uint64_t batch = 0;    // the batch id, echoed back
  std::vector<std::uint64_t> indices;  // 1 .. batch_size sample indices
  std::uint64_t address = 0;  // a direct connection: the buffer (batch_bytes) to write; else 0 (UCX)
  static void fields(auto& m, auto& v) {
    v("lease", m.lease);
    v("epoch", m.epoch);
    v("batch", m.batch);
    v("indices", m.indices);
    v("address", m.address);
  }
  void check() const;
  bool operator==(const Produce&) const = default;
};

struct Skipped {
  std::uint64_t index = 0;
  std::string reason;
  static void fields(auto& m, auto& v) {
    v("index", m.index);
    v("reason", m.reason, kMaxText);
  }
  bool operator==(const Skipped&) const = default;
};

struct BatchReady {
  static constexpr MsgType kType = MsgType::kBatchReady;
  std::uint64_t lease = 0;
  std::uint64_t batch = 0;
  std::uint32_t count = 0;        // samples in the buffer (fewer than asked when some were skipped)
  std::uint64_t bytes = 0;        // bytes sent into the buffer
  std::vector<Skipped> skipped;   // with the skip policy
  // The share of the daemon's compute pool spent making batches over the
  // kBusyWindow before this answer left, in [0, 1]: the trainers size their
  // fleet of daemons by it (dlop.data.autoscale). A short window says how
  // busy the daemon is now, so that a fleet that turned idle shows it within
  // a few batches; a few seconds still span many batches, so the figure does
  // not jump between 0 and 1 with whether one was being made at that instant.
  // The fleet's controller waits this long after a change before it trusts
  // the figure (dlop.scaling.controller).
  static constexpr std::chrono::seconds kBusyWindow{3};
  double busy = 0;
  static void fields(auto& m, auto& v) {
    v("lease", m.lease);
    v("batch", m.batch);
    v("count", m.count);
    v("bytes", m.bytes);
    v("skipped", m.skipped);
    v("busy", m.busy);
  }
  void check() const;
  bool operator==(const BatchReady&) const = default;
};

enum class ErrorCode : std::uint32_t {
  kBadRequest = 1,      // a valid frame that makes no sense now (e.g. PRODUCE before CONFIGURE)
  kInvalidArgument = 2, // bad spec, source, index or batch size
  kSample = 3,          // a sample could not be read or decoded (raise policy)
  kBusy = 4,            // too many leases queued for this connection
  kInternal = 5,        // the daemon failed (out of memory, transport)
};
inline constexpr std::uint32_t kMaxErrorCode = 5;

struct ErrorMsg {
  static constexpr MsgType kType = MsgType::kError;
  std::uint64_t lease = 0;    // 0: about CONFIGURE or the connection
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  static void fields(auto& m, auto& v) {
    v("lease", m.lease);
    v("code", m.code, Range{1, kMaxErrorCode});
    v("message", m.message, kMaxText);
  }
  bool operator==(const ErrorMsg&) const = default;
};

struct Cancel {
  static constexpr MsgType kType = MsgType::kCancel;
  std::uint64_t lease = 0;
  static void fields(auto& m, auto& v) { v("lease", m.lease); }
  bool operator==(const Cancel&) const = default;
};

struct Canceled {
  static constexpr MsgType kType = MsgType::kCanceled;
  std::uint64_t lease = 0;
  static void fields(auto& m, auto& v) { v("lease", m.lease); }
  bool operator==(const Canceled&) const = default;
};

struct StatsRequest {
  static constexpr MsgType kType = MsgType::kStatsRequest;
  static void fields(auto&, auto&) {}
  bool operator==(const StatsRequest&) const = default;
};

// One pipeline stage: items processed, seconds spent (summed over threads),
// bytes produced or moved.
struct StageStats {
  std::string name;
  std::uint64_t items = 0;
  double seconds = 0;
  std::uint64_t bytes = 0;
  static void fields(auto& m, auto& v) {
    v("name", m.name, kMaxName);
    v("items", m.items);
    v("seconds", m.seconds);
    v("bytes", m.bytes);
  }
  bool operator==(const StageStats&) const = default;
};

struct Stats {
  static constexpr MsgType kType = MsgType::kStats;
  std::vector<StageStats> stages;
  std::vector<std::pair<std::string, std::uint64_t>> counters;
  static void fields(auto& m, auto& v) {
    v("stages", m.stages);
    v("counters", m.counters);  // each: its name (up to kMaxName bytes), then its value
  }
  void check() const;
  bool operator==(const Stats&) const = default;
};

struct Ping {
  static constexpr MsgType kType = MsgType::kPing;
  std::uint64_t token = 0;
  static void fields(auto& m, auto& v) { v("token", m.token); }
  bool operator==(const Ping&) const = default;
};

struct Pong {
  static constexpr MsgType kType = MsgType::kPong;
  std::uint64_t token = 0;  // the PING's
  static void fields(auto& m, auto& v) { v("token", m.token); }
  bool operator==(const Pong&) const = default;
};

// A message: a struct with its kType and its fields() (above). encode and
// decode exist for every one of them (messages.cpp lists them).
template <class M>
concept Message = requires {
  { M::kType } -> std::convertible_to<MsgType>;
};

template <Message M>
Bytes encode(const M& m);
template <Message M>
M decode(std::span<const std::uint8_t> payload);

// Parses a frame's payload by its type, for tools and the fuzzer: throws as
// decode<M> does.
void decode_any(MsgType type, std::span<const std::uint8_t> payload);

}  // namespace dlop::offload::protocol
