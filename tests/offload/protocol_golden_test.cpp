// The wire format is frozen per protocol version: every message, encoded by
// today's code, must give the bytes recorded for the newest version that
// changed it (protocol_v6_golden.hpp, v5, v4, else protocol_v3_golden.hpp,
// written by the hand-written encoders of version 3, before the messages
// were described by field tables); and those bytes must decode back to the
// message.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <set>
#include <string>

#include "offload/protocol_messages.hpp"
#include "protocol_v3_golden.hpp"
#include "protocol_v4_golden.hpp"
#include "protocol_v5_golden.hpp"
#include "protocol_v6_golden.hpp"

namespace dlop::offload::protocol {
namespace {

std::string hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const std::uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

Bytes unhex(std::string_view text) {
  Bytes out;
  for (std::size_t i = 0; i + 1 < text.size(); i += 2) {
    out.push_back(static_cast<std::uint8_t>(std::stoi(std::string(text.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

Nonce counting(std::uint8_t first) {
  Nonce n{};
  for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<std::uint8_t>(first + i);
  return n;
}

struct Case {
  std::string name;
  MsgType type;
  Bytes encoded;
  // Decodes bytes and re-encodes what it got; throws as decode<M> does.
  std::function<Bytes(std::span<const std::uint8_t>)> decode_encode;
  // Whether bytes decode to the very message the case encoded.
  std::function<bool(std::span<const std::uint8_t>)> decodes_to_it;
};

template <class M>
Case make_case(std::string name, const M& m) {
  return Case{std::move(name), M::kType, encode(m), [](std::span<const std::uint8_t> p) { return encode(decode<M>(p)); },
              [m](std::span<const std::uint8_t> p) { return decode<M>(p) == m; }};
}

// Every message, with every field away from its default where it can be.
std::vector<Case> cases() {
  return {
      make_case("challenge", Challenge{counting(0)}),
      make_case("hello", Hello{counting(0x40), counting(0xa0), "trainer 3"}),
      make_case("welcome", Welcome{8, 4242, "dlop-offloader 0.1.0", "host-a/boot-1234", counting(0x80)}),
      make_case("configure_direct", Configure{{1, 2, 3, 4, 5}, "host-a/boot-1234", "/data/train", R"({"ops": []})", {},
                                              0x0123456789abcdefull, 64, 4242, 0x7fff0000beefull, 256u << 10}),
      make_case("configure_python", Configure{{9}, "host-b", "", "", {0x80, 0x04, 0x95}, 7, 1, 0, 0, 0}),
      make_case("configured_float32_direct",
                Configured{1000, 10, {3, 8, 8}, Dtype::kFloat32, 768, 1, 1536, 0, 1552, true}),
      make_case("configured_uint8", Configured{5, 2, {3, 4, 5}, Dtype::kUint8, 60, 1, 120, 0, 136, false}),
      make_case("configured_python", Configured{77, 0, {}, Dtype::kPythonBlob, 0, 1, 0, 0, 0, false}),
      make_case("configured_audio_lengths",
                Configured{300, 3, {80, 201}, Dtype::kFloat32, 64320, 1, 128640, 128704, 128720, false}),
      make_case("configured_video_multi_label",
                Configured{40, 157, {2, 3, 16, 8, 8}, Dtype::kUint8, 6144, 157, 12288, 0, 14800, true}),
      make_case("produce", Produce{9, 2, 17, {5, 1, 99, 0xffffffffffull}, 0x7f0012345000ull}),
      make_case("batch_ready", BatchReady{9, 17, 2, 1552, {{1, "corrupt"}, {300, "truncated jpeg"}}, 0.75}),
      make_case("batch_ready_none_skipped", BatchReady{10, 18, 4, 3104, {}, 1.0}),
      make_case("error", ErrorMsg{9, ErrorCode::kSample, "bad jpeg"}),
      make_case("error_connection", ErrorMsg{0, ErrorCode::kInvalidArgument, ""}),
      make_case("cancel", Cancel{5}),
      make_case("canceled", Canceled{0x1122334455667788ull}),
      make_case("stats_request", StatsRequest{}),
      make_case("stats", Stats{{{"read", 10, 0.5, 100}, {"decode", 1ull << 40, 1e-9, 0}}, {{"batches_ready", 3}, {"", 0}}}),
      make_case("stats_empty", Stats{}),
      make_case("ping", Ping{77}),
      make_case("pong", Pong{0xfedcba9876543210ull}),
  };
}

// The recorded bytes of version 6's message `name`: those of the newest
// version that changed the message; nullopt if none are recorded.
std::optional<std::string_view> golden_v6(std::string_view name) {
  for (const auto& [n, bytes] : kProtocolV6Changed) {
    if (n == name) return bytes;
  }
  for (const auto& [n, bytes] : kProtocolV5Changed) {
    if (n == name) return bytes;
  }
  for (const auto& [n, bytes] : kProtocolV4Changed) {
    if (n == name) return bytes;
  }
  for (const auto& [n, bytes] : kProtocolV3Golden) {
    if (n == name) return bytes;
  }
  return std::nullopt;
}

TEST(OffloadProtocolGolden, EveryMessageEncodesToTheVersion6Bytes) {
  static_assert(kVersion == 6, "a new protocol version records new golden bytes beside these");
  std::set<std::string> recorded;
  for (const auto& [name, bytes] : kProtocolV3Golden) recorded.insert(std::string(name));
  for (const auto& [name, bytes] : kProtocolV4Changed) recorded.insert(std::string(name));
  for (const auto& [name, bytes] : kProtocolV5Changed) recorded.insert(std::string(name));
  for (const auto& [name, bytes] : kProtocolV6Changed) recorded.insert(std::string(name));
  std::set<MsgType> types;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    types.insert(c.type);
    const std::optional<std::string_view> expected = golden_v6(c.name);
    if (!expected) {
      ADD_FAILURE() << "no golden bytes for {\"" << c.name << "\", \"" << hex(c.encoded) << "\"}";
      continue;
    }
    recorded.erase(c.name);
    if (hex(c.encoded) != *expected) {
      ADD_FAILURE() << "encodes to {\"" << c.name << "\", \"" << hex(c.encoded) << "\"}, not the recorded " << *expected;
      continue;
    }
    const Bytes golden = unhex(*expected);
    EXPECT_EQ(c.decode_encode(golden), golden);
    EXPECT_TRUE(c.decodes_to_it(golden));
  }
  EXPECT_TRUE(recorded.empty()) << "golden bytes no case makes: " << *recorded.begin();
  EXPECT_EQ(types.size(), std::size_t{kMaxMsgType}) << "a message type without a golden case";
}

}  // namespace
}  // namespace dlop::offload::protocol
