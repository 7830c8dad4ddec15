#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/sha.h>

#include <cstring>
#include <memory>

#include "core/error.hpp"
#include "offload/protocol.hpp"
#include "wire.hpp"

namespace dlop::offload::protocol {

std::string_view type_name(MsgType type) {
  switch (type) {
    case MsgType::kChallenge: return "CHALLENGE";
    case MsgType::kHello: return "HELLO";
    case MsgType::kWelcome: return "WELCOME";
    case MsgType::kConfigure: return "CONFIGURE";
    case MsgType::kConfigured: return "CONFIGURED";
    case MsgType::kProduce: return "PRODUCE";
    case MsgType::kBatchReady: return "BATCH_READY";
    case MsgType::kError: return "ERROR";
    case MsgType::kCancel: return "CANCEL";
    case MsgType::kCanceled: return "CANCELED";
    case MsgType::kStatsRequest: return "STATS_REQUEST";
    case MsgType::kStats: return "STATS";
    case MsgType::kPing: return "PING";
    case MsgType::kPong: return "PONG";
  }
  return "UNKNOWN";
}

namespace {

struct MacCtxFree {
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};
using MacCtx = std::unique_ptr<EVP_MAC_CTX, MacCtxFree>;

[[noreturn]] void openssl_failed() { throw_error(Errc::kSystem, "OpenSSL could not compute an HMAC-SHA256"); }

// A context keyed once, restarted for each frame. OpenSSL 3's one-shot HMAC()
// fetches the digest and keys a new context on every call, which made the
// MACs a fifth of a trainer's CPU per offloaded batch. A thread seals and
// checks under a few keys (one per direction and connection), so a small
// per-thread cache holds them.
EVP_MAC_CTX& keyed_context(const Key& key) {
  struct Entry {
    Key key{};
    MacCtx ctx;
  };
  constexpr std::size_t kEntries = 8;
  thread_local std::array<Entry, kEntries> cache;
  thread_local std::size_t next_victim = 0;
  for (Entry& e : cache) {
    if (e.ctx && e.key == key) return *e.ctx;
  }
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (hmac == nullptr) openssl_failed();
  MacCtx ctx(EVP_MAC_CTX_new(hmac));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  if (!ctx || EVP_MAC_init(ctx.get(), key.data(), key.size(), params) != 1) openssl_failed();
  Entry& e = cache[next_victim++ % kEntries];
  e.key = key;
  e.ctx = std::move(ctx);
  return *e.ctx;
}

}  // namespace

std::array<std::uint8_t, kMacBytes> seal(const std::optional<Key>& key, std::span<const std::uint8_t> bytes) {
  std::array<std::uint8_t, EVP_MAX_MD_SIZE> digest{};
  std::size_t length = 0;
  if (key) {
    EVP_MAC_CTX* ctx = &keyed_context(*key);
    // A null key restarts the MAC under the key it holds.
    if (EVP_MAC_init(ctx, nullptr, 0, nullptr) != 1 || EVP_MAC_update(ctx, bytes.data(), bytes.size()) != 1 ||
        EVP_MAC_final(ctx, digest.data(), &length, digest.size()) != 1) {
      openssl_failed();
    }
  } else {
    unsigned int n = 0;
    if (EVP_Digest(bytes.data(), bytes.size(), digest.data(), &n, EVP_sha256(), nullptr) != 1) n = 0;
    length = n;
  }
  if (length < kMacBytes) throw_error(Errc::kSystem, "OpenSSL could not compute a SHA-256 digest");
  std::array<std::uint8_t, kMacBytes> mac{};
  std::memcpy(mac.data(), digest.data(), kMacBytes);
  return mac;
}

Bytes FrameWriter::encode(MsgType type, std::span<const std::uint8_t> payload) {
  if (payload.size() > kMaxPayload) {
    throw_error(Errc::kInvalidArgument, std::string(type_name(type)) + " payload of " +
                                            std::to_string(payload.size()) + " bytes is over the frame limit");
  }
  Bytes frame;
  frame.reserve(kHeaderBytes + payload.size() + kMacBytes);
  Writer w(frame);
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(static_cast<std::uint16_t>(type));
  w.u32(0);  // flags
  w.u32(static_cast<std::uint32_t>(payload.size()));
  w.u64(sequence_++);
  frame.insert(frame.end(), payload.begin(), payload.end());
  const auto mac = seal(key_, frame);
  frame.insert(frame.end(), mac.begin(), mac.end());
  return frame;
}

void FrameDecoder::fail(const std::string& reason) {
  failure_ = reason;
  buffer_.clear();
  consumed_ = 0;
  throw_error(Errc::kProtocol, reason);
}

void FrameDecoder::feed(std::span<const std::uint8_t> bytes) {
  if (!failure_.empty()) return;
  // Drop what earlier frames used before growing, so the buffer stays about
  // one frame long however long the connection lives.
  if (consumed_ > 0) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(consumed_));
    consumed_ = 0;
  }
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
}

std::optional<Frame> FrameDecoder::next() {
  if (!failure_.empty()) throw_error(Errc::kProtocol, "connection already failed: " + failure_);
  const std::span<const std::uint8_t> avail(buffer_.data() + consumed_, buffer_.size() - consumed_);
  if (avail.size() < kHeaderBytes) {
    // Refuse a wrong magic as soon as its bytes are in, so that a stray
    // client (HTTP, TLS) is told at once rather than after 24 bytes.
    const std::uint8_t magic[4] = {'D', 'L', 'O', 'F'};
    for (std::size_t i = 0; i < std::min<std::size_t>(avail.size(), 4); ++i) {
      if (avail[i] != magic[i]) fail("bad magic: not a dlop offload frame");
    }
    return std::nullopt;
  }
  Reader r(avail.first(kHeaderBytes));
  if (r.u32() != kMagic) fail("bad magic: not a dlop offload frame");
  const std::uint16_t version = r.u16();
  if (version != kVersion) {
    fail("protocol version " + std::to_string(version) + " not supported (this side speaks " +
         std::to_string(kVersion) + ")");
  }
  const std::uint16_t type = r.u16();
  if (type == 0 || type > kMaxMsgType) fail("unknown message type " + std::to_string(type));
  const std::uint32_t flags = r.u32();
  if (flags != 0) fail("unknown flags " + std::to_string(flags));
  const std::uint32_t length = r.u32();
  if (length > max_payload_) {
    fail(std::string(type_name(MsgType{type})) + " payload of " + std::to_string(length) + " bytes is over the " +
         std::to_string(max_payload_) + "-byte limit");
  }
  const std::uint64_t sequence = r.u64();
  if (sequence != sequence_) {
    fail("sequence number " + std::to_string(sequence) + " where " + std::to_string(sequence_) +
         " was due (replayed, reordered or dropped frame)");
  }
  const std::size_t total = kHeaderBytes + length + kMacBytes;
  if (avail.size() < total) return std::nullopt;

  const auto mac = seal(key_, avail.first(kHeaderBytes + length));
  if (CRYPTO_memcmp(mac.data(), avail.data() + kHeaderBytes + length, kMacBytes) != 0) {
    fail(std::string(key_ ? "bad MAC" : "bad checksum") + " on " + std::string(type_name(MsgType{type})) +
         " frame " + std::to_string(sequence));
  }
  Frame frame;
  frame.type = MsgType{type};
  frame.sequence = sequence;
  frame.payload.assign(avail.begin() + kHeaderBytes, avail.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes + length));
  ++sequence_;
  consumed_ += total;
  if (consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  }
  return frame;
}

}  // namespace dlop::offload::protocol
