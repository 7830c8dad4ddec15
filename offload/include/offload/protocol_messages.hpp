// The messages of the offload protocol (payloads of the frames in
// protocol.hpp). Each struct names its MsgType; encode() writes its payload
// and decode<M>() parses one, throwing dlop::Error(kProtocol) on anything
// truncated, oversized, out of range or followed by trailing bytes.
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
inline constexpr std::size_t kMaxPython = 15u << 20;  // a pickled Dataset + collate_fn (the frame holds 16 MiB)

struct Challenge {
  static constexpr MsgType kType = MsgType::kChallenge;
  Nonce server_nonce{};
};

struct Hello {
  static constexpr MsgType kType = MsgType::kHello;
  Nonce client_nonce{};
  Digest proof{};            // hello_proof(token, server nonce, client nonce)
  std::string client_name;   // for the daemon's logs
};

struct Welcome {
  static constexpr MsgType kType = MsgType::kWelcome;
  std::uint32_t threads = 0;  // the daemon's compute threads
  std::uint32_t pid = 0;
  std::string daemon_name;    // host and version, for the client's logs
  std::string host;           // the daemon's host_identity(): with pid, tells the client when it is gone
  Nonce direct_nonce{};       // a same-host client proves its pid by holding this in its memory (CONFIGURE)
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
};

// kPythonBlob: the generic Python path. Batches are blobs of varying size
// (dlop.data._python_job) and every size field of the layout is 0; BATCH_READY
// comes before the data and gives its size, and the client posts its receive
// then.
enum class Dtype : std::uint8_t { kFloat32 = 0, kUint8 = 1, kPythonBlob = 2 };

// The layout of one batch in the client's buffer: images (count x C x H x W
// of dtype) from offset 0, labels (count int64) from labels_offset, where
// count <= batch_size is the BATCH_READY's count. batch_bytes is the buffer
// size PRODUCE needs.
struct Configured {
  static constexpr MsgType kType = MsgType::kConfigured;
  std::uint64_t dataset_size = 0;
  std::uint32_t classes = 0;
  std::uint32_t channels = 0, height = 0, width = 0;
  Dtype dtype = Dtype::kFloat32;
  std::uint64_t sample_bytes = 0;
  std::uint64_t labels_offset = 0;
  std::uint64_t batch_bytes = 0;
  bool direct = false;  // the daemon writes batches straight into the addresses PRODUCE names
};

struct Produce {
  static constexpr MsgType kType = MsgType::kProduce;
  std::uint64_t lease = 0;    // nonzero, unique among the client's open leases; also the UCX tag
  std::uint64_t epoch = 0;
  std::uint64_t batch = 0;    // the batch id, echoed back
  std::vector<std::uint64_t> indices;  // 1 .. batch_size sample indices
  std::uint64_t address = 0;  // a direct connection: the buffer (batch_bytes) to write; else 0 (UCX)
};

struct Skipped {
  std::uint64_t index = 0;
  std::string reason;
};

struct BatchReady {
  static constexpr MsgType kType = MsgType::kBatchReady;
  std::uint64_t lease = 0;
  std::uint64_t batch = 0;
  std::uint32_t count = 0;        // samples in the buffer (fewer than asked when some were skipped)
  std::uint64_t bytes = 0;        // bytes sent into the buffer
  std::vector<Skipped> skipped;   // with the skip policy
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
};

struct Cancel {
  static constexpr MsgType kType = MsgType::kCancel;
  std::uint64_t lease = 0;
};

struct Canceled {
  static constexpr MsgType kType = MsgType::kCanceled;
  std::uint64_t lease = 0;
};

struct StatsRequest {
  static constexpr MsgType kType = MsgType::kStatsRequest;
};

// One pipeline stage: items processed, seconds spent (summed over threads),
// bytes produced or moved.
struct StageStats {
  std::string name;
  std::uint64_t items = 0;
  double seconds = 0;
  std::uint64_t bytes = 0;
};

struct Stats {
  static constexpr MsgType kType = MsgType::kStats;
  std::vector<StageStats> stages;
  std::vector<std::pair<std::string, std::uint64_t>> counters;
};

struct Ping {
  static constexpr MsgType kType = MsgType::kPing;
  std::uint64_t token = 0;
};

struct Pong {
  static constexpr MsgType kType = MsgType::kPong;
  std::uint64_t token = 0;  // the PING's
};

Bytes encode(const Challenge& m);
Bytes encode(const Hello& m);
Bytes encode(const Welcome& m);
Bytes encode(const Configure& m);
Bytes encode(const Configured& m);
Bytes encode(const Produce& m);
Bytes encode(const BatchReady& m);
Bytes encode(const ErrorMsg& m);
Bytes encode(const Cancel& m);
Bytes encode(const Canceled& m);
Bytes encode(const StatsRequest& m);
Bytes encode(const Stats& m);
Bytes encode(const Ping& m);
Bytes encode(const Pong& m);

template <class M>
M decode(std::span<const std::uint8_t> payload);
template <>
Challenge decode<Challenge>(std::span<const std::uint8_t> payload);
template <>
Hello decode<Hello>(std::span<const std::uint8_t> payload);
template <>
Welcome decode<Welcome>(std::span<const std::uint8_t> payload);
template <>
Configure decode<Configure>(std::span<const std::uint8_t> payload);
template <>
Configured decode<Configured>(std::span<const std::uint8_t> payload);
template <>
Produce decode<Produce>(std::span<const std::uint8_t> payload);
template <>
BatchReady decode<BatchReady>(std::span<const std::uint8_t> payload);
template <>
ErrorMsg decode<ErrorMsg>(std::span<const std::uint8_t> payload);
template <>
Cancel decode<Cancel>(std::span<const std::uint8_t> payload);
template <>
Canceled decode<Canceled>(std::span<const std::uint8_t> payload);
template <>
StatsRequest decode<StatsRequest>(std::span<const std::uint8_t> payload);
template <>
Stats decode<Stats>(std::span<const std::uint8_t> payload);
template <>
Ping decode<Ping>(std::span<const std::uint8_t> payload);
template <>
Pong decode<Pong>(std::span<const std::uint8_t> payload);

// Parses a frame's payload by its type, for tools and the fuzzer: throws as
// decode<M> does.
void decode_any(MsgType type, std::span<const std::uint8_t> payload);

}  // namespace dlop::offload::protocol
