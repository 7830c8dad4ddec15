// The offload wire protocol without a daemon: frames and messages round-trip,
// every kind of malformed input is refused with kProtocol (and only that),
// authentication proofs and keys, token files.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>

#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "core/error.hpp"
#include "media/test_data.hpp"
#include "offload/protocol.hpp"
#include "offload/protocol_auth.hpp"
#include "offload/protocol_messages.hpp"

namespace dlop::offload::protocol {
namespace {

template <class M>
M round_trip(const M& m) {
  FrameWriter w;
  FrameDecoder d(kMaxPayload);
  d.feed(w.encode(M::kType, encode(m)));
  auto f = d.next();
  EXPECT_TRUE(f.has_value());
  EXPECT_EQ(f->type, M::kType);
  EXPECT_FALSE(d.next().has_value());
  return decode<M>(f->payload);
}

void expect_protocol_error(const std::function<void()>& fn, const std::string& fragment = "") {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kProtocol) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

Configure sample_configure() {
  return Configure{{1, 2, 3, 4}, "trainer-host", "/data/train", R"({"ops": []})", {9, 8}, 42, 64};
}

TEST(OffloadProtocol, EveryMessageRoundTrips) {
  const Nonce n = random_nonce();
  EXPECT_EQ(round_trip(Challenge{n}).server_nonce, n);
  const Hello h = round_trip(Hello{n, Digest{7}, "trainer 3"});
  EXPECT_EQ(h.client_nonce, n);
  EXPECT_EQ(h.proof[0], 7);
  EXPECT_EQ(h.client_name, "trainer 3");
  EXPECT_EQ(round_trip(Welcome{4, 1234, "d", "host-a"}).pid, 1234u);
  EXPECT_EQ(round_trip(Welcome{4, 1234, "d", "host-a"}).host, "host-a");
  EXPECT_EQ(round_trip(Welcome{4, 1234, "d", "host-a", n}).direct_nonce, n);
  const Configure c = round_trip(sample_configure());
  EXPECT_EQ(c.worker_address, (Bytes{1, 2, 3, 4}));
  EXPECT_EQ(c.host, "trainer-host");
  EXPECT_EQ(c.source, "/data/train");
  EXPECT_EQ(c.python, (Bytes{9, 8}));
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(c.batch_size, 64u);
  EXPECT_EQ(c.pid, 0u);
  Configure direct = sample_configure();
  direct.pid = 4242;
  direct.proof_address = 0x7fff0000beefull;
  EXPECT_EQ(round_trip(direct).pid, 4242u);
  EXPECT_EQ(round_trip(direct).proof_address, 0x7fff0000beefull);
  const Configured layout{1000, 10, {3, 8, 8}, Dtype::kFloat32, 768, 1, 1536, 0, 1552};
  const Configured l2 = round_trip(layout);
  EXPECT_EQ(l2.labels_offset, 1536u);
  EXPECT_EQ(l2.dtype, Dtype::kFloat32);
  EXPECT_FALSE(l2.direct);
  Configured direct_layout = layout;
  direct_layout.direct = true;
  EXPECT_TRUE(round_trip(direct_layout).direct);
  const Produce p = round_trip(Produce{9, 2, 17, {5, 1, 99}, 0});
  EXPECT_EQ(p.indices, (std::vector<std::uint64_t>{5, 1, 99}));
  EXPECT_EQ(p.batch, 17u);
  EXPECT_EQ(p.address, 0u);
  EXPECT_EQ(round_trip(Produce{9, 2, 17, {5}, 0x7f0012345000ull}).address, 0x7f0012345000ull);
  const BatchReady r = round_trip(BatchReady{9, 17, 2, 1552, {{1, "corrupt"}}, 0.625});
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].reason, "corrupt");
  EXPECT_EQ(r.busy, 0.625);
  EXPECT_EQ(round_trip(BatchReady{9, 17, 2, 1552, {}, 0.0}).busy, 0.0);  // both ends of [0, 1]
  EXPECT_EQ(round_trip(BatchReady{9, 17, 2, 1552, {}, 1.0}).busy, 1.0);
  const ErrorMsg e = round_trip(ErrorMsg{9, ErrorCode::kSample, "bad jpeg"});
  EXPECT_EQ(e.code, ErrorCode::kSample);
  EXPECT_EQ(round_trip(Cancel{5}).lease, 5u);
  EXPECT_EQ(round_trip(Canceled{5}).lease, 5u);
  round_trip(StatsRequest{});
  const Stats s = round_trip(Stats{{{"read", 10, 0.5, 100}}, {{"batches_ready", 3}}});
  EXPECT_EQ(s.stages[0].seconds, 0.5);
  EXPECT_EQ(s.counters[0].second, 3u);
  EXPECT_EQ(round_trip(Ping{77}).token, 77u);
  EXPECT_EQ(round_trip(Pong{77}).token, 77u);
}

TEST(OffloadProtocol, FramesSplitAnywhereStillDecode) {
  FrameWriter w;
  Bytes stream;
  for (std::uint64_t i = 0; i < 3; ++i) {
    const Bytes f = w.encode(MsgType::kPing, encode(Ping{i}));
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (std::size_t cut = 1; cut < stream.size(); ++cut) {
    FrameDecoder d;
    d.feed(std::span(stream).first(cut));
    std::vector<Frame> got;
    while (auto f = d.next()) got.push_back(*f);
    d.feed(std::span(stream).subspan(cut));
    while (auto f = d.next()) got.push_back(*f);
    ASSERT_EQ(got.size(), 3u) << "cut at " << cut;
    for (std::uint64_t i = 0; i < 3; ++i) EXPECT_EQ(decode<Ping>(got[i].payload).token, i);
    EXPECT_FALSE(d.partial());
  }
}

// Rewrites header field bytes of an encoded frame (then the seal is wrong
// too, but the header checks come first).
Bytes patched(Bytes frame, std::size_t offset, std::initializer_list<std::uint8_t> bytes) {
  std::copy(bytes.begin(), bytes.end(), frame.begin() + static_cast<std::ptrdiff_t>(offset));
  return frame;
}

void expect_refused(const Bytes& bytes, const std::string& fragment, std::optional<Key> key = std::nullopt) {
  FrameDecoder d(kMaxPreAuthPayload);
  if (key) d.set_key(*key);
  expect_protocol_error(
      [&] {
        d.feed(bytes);
        while (d.next()) {
        }
      },
      fragment);
  // A failed decoder refuses everything after, even good frames.
  FrameWriter w;
  expect_protocol_error([&] {
    d.feed(w.encode(MsgType::kPing, encode(Ping{1})));
    d.next();
  });
}

TEST(OffloadProtocol, MalformedFramesAreRefused) {
  FrameWriter w;
  const Bytes good = w.encode(MsgType::kPing, encode(Ping{1}));
  expect_refused(patched(good, 0, {'G', 'E', 'T', ' '}), "bad magic");
  expect_refused(Bytes{'H'}, "bad magic");  // refused before a whole header arrives
  expect_refused(patched(good, 4, {5, 0}), "version 5 not supported");  // the version before the current one
  expect_refused(patched(good, 4, {7, 0}), "version 7 not supported");
  expect_refused(patched(good, 6, {0, 0}), "unknown message type 0");
  expect_refused(patched(good, 6, {99, 0}), "unknown message type 99");
  expect_refused(patched(good, 8, {1, 0, 0, 0}), "unknown flags");
  expect_refused(patched(good, 12, {0, 0, 0, 0x40}), "over the 1024-byte limit");
  expect_refused(patched(good, 16, {1}), "sequence number 1 where 0 was due");
  Bytes flipped = good;
  flipped[kHeaderBytes] ^= 1;  // payload bit
  expect_refused(flipped, "bad checksum");
  flipped = good;
  flipped.back() ^= 0x80;  // seal bit
  expect_refused(flipped, "bad checksum");

  // Keyed: a frame sealed under another key, or only checksummed, fails.
  Key key{}, other{};
  key[0] = 1;
  other[0] = 2;
  FrameWriter keyed, wrong;
  keyed.set_key(key);
  wrong.set_key(other);
  expect_refused(wrong.encode(MsgType::kPing, encode(Ping{1})), "bad MAC", key);
  expect_refused(good, "bad MAC", key);
  FrameDecoder ok(kMaxPayload);
  ok.set_key(key);
  ok.feed(keyed.encode(MsgType::kPing, encode(Ping{1})));
  EXPECT_TRUE(ok.next().has_value());
}

TEST(OffloadProtocol, ReplayedAndReorderedFramesAreRefused) {
  FrameWriter w;
  const Bytes f0 = w.encode(MsgType::kPing, encode(Ping{0}));
  const Bytes f1 = w.encode(MsgType::kPing, encode(Ping{1}));
  FrameDecoder replay;
  replay.feed(f0);
  ASSERT_TRUE(replay.next());
  expect_protocol_error([&] { replay.feed(f0); replay.next(); }, "replayed");
  FrameDecoder reorder;
  expect_protocol_error([&] { reorder.feed(f1); reorder.next(); }, "sequence number 1 where 0");
}

TEST(OffloadProtocol, MalformedMessagesAreRefused) {
  const Bytes good = encode(sample_configure());
  EXPECT_NO_THROW(decode<Configure>(good));
  for (std::size_t n = 0; n < good.size(); ++n) {
    expect_protocol_error([&] { decode<Configure>(std::span(good).first(n)); });
  }
  Bytes trailing = good;
  trailing.push_back(0);
  expect_protocol_error([&] { decode<Configure>(trailing); }, "trailing");
  // A count far beyond the payload is refused before anything is allocated.
  Bytes huge = encode(Produce{1, 0, 0, {1}});
  huge[24] = huge[25] = huge[26] = huge[27] = 0xff;
  expect_protocol_error([&] { decode<Produce>(huge); }, "larger than the payload");
  expect_protocol_error([&] { decode<Produce>(encode(Produce{0, 0, 0, {1}})); }, "lease 0");
  expect_protocol_error([&] { decode<Produce>(encode(Produce{1, 0, 0, {}})); }, "0 indices");
  Configure zero = sample_configure();
  zero.batch_size = 0;
  expect_protocol_error([&] { decode<Configure>(encode(zero)); }, "batch size 0");
  expect_protocol_error([&] { decode<Configured>(encode(Configured{1, 1, {3, 8, 8}, Dtype::kUint8, 100, 1, 128, 0, 136})); },
                        "inconsistent");
  // Lengths that would overlap the labels, and a shape with a zero or too many dimensions.
  expect_protocol_error(
      [&] { decode<Configured>(encode(Configured{1, 1, {2, 4}, Dtype::kFloat32, 32, 1, 64, 64, 80})); }, "inconsistent");
  expect_protocol_error(
      [&] { decode<Configured>(encode(Configured{1, 1, {2, 0}, Dtype::kFloat32, 0, 1, 64, 0, 80})); }, "inconsistent");
  expect_protocol_error([&] {
    decode<Configured>(encode(Configured{1, 1, {1, 1, 1, 1, 1, 1, 1}, Dtype::kUint8, 1, 1, 64, 0, 72}));
  }, "inconsistent");
  Bytes bad_code = encode(ErrorMsg{1, ErrorCode::kSample, "x"});
  bad_code[8] = 77;
  expect_protocol_error([&] { decode<ErrorMsg>(bad_code); }, "unknown code 77");
  expect_protocol_error([&] { decode<Stats>(encode(Stats{{{"read", 1, -1.0, 0}}, {}})); }, "bad time");
  // A busy fraction is a share of the daemon's time: outside [0, 1], or not a number, is refused.
  for (const double busy : {-0.01, 1.01, std::numeric_limits<double>::quiet_NaN(),
                            std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(busy);
    expect_protocol_error([&] { decode<BatchReady>(encode(BatchReady{9, 17, 2, 1552, {}, busy})); },
                          "BATCH_READY with busy fraction");
  }
}

// The parsers' standing test when no fuzzer is built (and a quick one when
// it is): random bytes and random mutations of valid frames, from a fixed
// seed, must only ever raise dlop::Error(kProtocol).
TEST(OffloadProtocol, RandomBytesOnlyEverRaiseProtocolErrors) {
  std::mt19937_64 rng(20261122);
  std::vector<Bytes> valid;
  FrameWriter w;
  valid.push_back(w.encode(MsgType::kConfigure, encode(sample_configure())));
  valid.push_back(w.encode(MsgType::kBatchReady, encode(BatchReady{9, 17, 2, 1552, {{1, "corrupt"}}, 0.5})));
  valid.push_back(w.encode(MsgType::kStats, encode(Stats{{{"read", 10, 0.5, 100}}, {{"x", 3}}})));
  std::size_t frames = 0, refused = 0;
  for (int round = 0; round < 20000; ++round) {
    Bytes input;
    if (round % 2 == 0) {
      input.resize(rng() % 200);
      for (auto& b : input) b = static_cast<std::uint8_t>(rng());
      if (round % 4 == 0 && input.size() >= 4) std::copy_n("DLOF", 4, input.begin());
    } else {
      input = valid[rng() % valid.size()];
      for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k) input[rng() % input.size()] ^= static_cast<std::uint8_t>(1 + rng() % 255);
    }
    FrameDecoder d(kMaxPayload);
    try {
      d.feed(input);
      while (auto f = d.next()) {
        ++frames;
        decode_any(f->type, f->payload);
      }
      // Also the message parsers alone, on the raw bytes.
      decode_any(MsgType{static_cast<std::uint16_t>(1 + rng() % kMaxMsgType)}, input);
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), Errc::kProtocol) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 19000u);
}

// seal() keeps keyed contexts per thread: its MACs must still be OpenSSL's
// one-shot HMAC-SHA256 of the bytes, under whichever key, from any thread,
// and after more keys than the cache holds.
TEST(OffloadProtocol, SealIsTheHmacOfTheBytesUnderEachKey) {
  std::mt19937 rng(7);
  std::vector<Key> keys(11);
  for (Key& k : keys) {
    for (auto& b : k) b = static_cast<std::uint8_t>(rng());
  }
  const auto check = [&](std::size_t rounds) {
    for (std::size_t round = 0; round < rounds; ++round) {
      for (const std::size_t length : {0u, 1u, 24u, 25u, 1000u, 70000u}) {
        const Key& key = keys[(round * 7 + length) % keys.size()];
        Bytes bytes(length);
        for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
        std::array<std::uint8_t, EVP_MAX_MD_SIZE> want{};
        unsigned int n = 0;
        ASSERT_NE(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), bytes.data(), bytes.size(),
                       want.data(), &n),
                  nullptr);
        const auto got = seal(key, bytes);
        ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << "length " << length << " round " << round;
      }
    }
  };
  check(20);
  std::thread other([&] { check(5); });
  other.join();
  EXPECT_NE(seal(keys[0], Bytes{1, 2, 3}), seal(keys[1], Bytes{1, 2, 3}));
  EXPECT_NE(seal(keys[0], Bytes{1, 2, 3}), seal(std::nullopt, Bytes{1, 2, 3}));
}

TEST(OffloadAuth, ProofsAndKeysDependOnTokenAndBothNonces) {
  const Nonce s = random_nonce(), c = random_nonce();
  EXPECT_NE(s, c);
  const Digest p = hello_proof("token-token-token", s, c);
  EXPECT_TRUE(proof_matches(p, hello_proof("token-token-token", s, c)));
  EXPECT_FALSE(proof_matches(p, hello_proof("token-token-tokeN", s, c)));
  EXPECT_FALSE(proof_matches(p, hello_proof("token-token-token", c, s)));
  const SessionKeys k = session_keys("token-token-token", s, c);
  EXPECT_NE(k.client_to_server, k.server_to_client);
  EXPECT_NE(k.client_to_server, session_keys("token-token-token", s, random_nonce()).client_to_server);
}

TEST(OffloadAuth, TokenFiles) {
  media::test::TempDir dir;
  const auto path = dir.path() / "token";
  std::ofstream(path) << "0123456789abcdefXYZ\n\n";
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(read_token_file(path, true), "0123456789abcdefXYZ");
  ::chmod(path.c_str(), 0644);
  EXPECT_THROW(read_token_file(path, true), Error);
  EXPECT_EQ(read_token_file(path, false), "0123456789abcdefXYZ");  // clients only warn
  std::ofstream(path, std::ios::trunc) << "short\n";
  ::chmod(path.c_str(), 0600);
  EXPECT_THROW(read_token_file(path, true), Error);
  EXPECT_THROW(read_token_file(dir.path() / "missing", true), Error);
}

}  // namespace
}  // namespace dlop::offload::protocol
