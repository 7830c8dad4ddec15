// The offload wire protocol's frames: what travels on the TCP control
// connection between a trainer's OffloadClient and a dlop-offloader. The
// messages inside the frames are in protocol_messages.hpp; authentication
// (tokens, nonces, session keys) in protocol_auth.hpp.
//
// A frame, all integers little-endian:
//
//   offset  size  field
//        0     4  magic     "DLOF"
//        4     2  version   kVersion; any other is refused
//        6     2  type      MsgType; unknown types are refused
//        8     4  flags     none defined in version 1: must be 0
//       12     4  length    payload bytes, at most the receiver's limit
//       16     8  sequence  per connection and direction: 0, 1, 2, ... exactly
//       24     n  payload
//     24+n    16  mac       HMAC-SHA256(direction key, bytes 0 .. 24+n)[0:16];
//                           before the keys exist (sequence 0 of each side:
//                           CHALLENGE and HELLO), SHA-256 of the same bytes
//
// Everything is checked before the payload is read (magic, version, type,
// flags, length, sequence), so a bad frame is refused after 24 bytes and an
// unauthenticated peer never makes the receiver buffer more than
// kMaxPreAuthPayload. Any violation is fatal for the connection: the decoder
// throws dlop::Error(kProtocol) with the reason and stays failed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dlop::offload::protocol {

using Bytes = std::vector<std::uint8_t>;
using Key = std::array<std::uint8_t, 32>;

inline constexpr std::uint32_t kMagic = 0x464f4c44;  // bytes 'D' 'L' 'O' 'F'
// 2: CONFIGURE carries the client's host and a Python dataset; 3: direct
// writes into a same-host trainer (WELCOME's nonce, CONFIGURE's pid and proof,
// CONFIGURED's direct, PRODUCE's address); 4: CONFIGURE's piece_bytes
// (batches over UCX in pieces); 5: CONFIGURED's layout of any media kind
// (a sample shape, labels per sample, lengths); 6: BATCH_READY's busy
// fraction (how loaded the daemon is, for sizing the fleet).
inline constexpr std::uint16_t kVersion = 6;
inline constexpr std::size_t kHeaderBytes = 24;
inline constexpr std::size_t kMacBytes = 16;
// Limits on one payload: before authentication (CHALLENGE, HELLO), and after.
inline constexpr std::uint32_t kMaxPreAuthPayload = 1024;
inline constexpr std::uint32_t kMaxPayload = 16u << 20;

enum class MsgType : std::uint16_t {
  kChallenge = 1,     // daemon -> client: server nonce (first frame)
  kHello = 2,         // client -> daemon: client nonce + proof of the token
  kWelcome = 3,       // daemon -> client: first frame under the session keys
  kConfigure = 4,     // client -> daemon: source, transform spec, seed, batch size, UCX address
  kConfigured = 5,    // daemon -> client: dataset size and batch layout
  kProduce = 6,       // client -> daemon: make one batch (lease, epoch, batch id, indices)
  kBatchReady = 7,    // daemon -> client: the batch was sent into the client's buffer
  kError = 8,         // daemon -> client: a lease (or CONFIGURE) failed
  kCancel = 9,        // client -> daemon: drop a lease
  kCanceled = 10,     // daemon -> client: the lease's buffer will not be touched again
  kStatsRequest = 11, // client -> daemon
  kStats = 12,        // daemon -> client: per-stage counters
  kPing = 13,         // client -> daemon
  kPong = 14,         // daemon -> client
};
inline constexpr std::uint16_t kMaxMsgType = 14;

std::string_view type_name(MsgType type);

struct Frame {
  MsgType type = MsgType::kPing;
  std::uint64_t sequence = 0;
  Bytes payload;
};

// Encodes the frames of one direction: numbers them and seals them.
class FrameWriter {
 public:
  // Frames from now on carry HMACs under `key` (until then: checksums).
  void set_key(const Key& key) { key_ = key; }
  Bytes encode(MsgType type, std::span<const std::uint8_t> payload);
  std::uint64_t next_sequence() const { return sequence_; }

 private:
  std::optional<Key> key_;
  std::uint64_t sequence_ = 0;
};

// Decodes the frames of one direction from a byte stream, as it arrives.
class FrameDecoder {
 public:
  explicit FrameDecoder(std::uint32_t max_payload = kMaxPreAuthPayload) : max_payload_(max_payload) {}
  // Later frames must carry HMACs under `key`, and may be up to max_payload.
  void set_key(const Key& key, std::uint32_t max_payload = kMaxPayload) {
    key_ = key;
    max_payload_ = max_payload;
  }
  // Buffers the bytes; nothing is parsed until next().
  void feed(std::span<const std::uint8_t> bytes);
  // The next complete frame, or nullopt when more bytes are needed. Throws
  // dlop::Error(kProtocol) naming what is wrong; the decoder then refuses
  // everything, as the connection must be closed.
  std::optional<Frame> next();
  // Bytes of an incomplete frame are buffered (a peer stalled mid-frame).
  bool partial() const { return buffer_.size() > consumed_; }
  std::uint64_t next_sequence() const { return sequence_; }

 private:
  [[noreturn]] void fail(const std::string& reason);

  std::optional<Key> key_;
  std::uint32_t max_payload_;
  std::uint64_t sequence_ = 0;
  Bytes buffer_;
  std::size_t consumed_ = 0;
  std::string failure_;
};

// The 16-byte seal of bytes 0 .. 24+n of a frame (see the table above).
std::array<std::uint8_t, kMacBytes> seal(const std::optional<Key>& key, std::span<const std::uint8_t> bytes);

}  // namespace dlop::offload::protocol
