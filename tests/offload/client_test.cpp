// OffloadClient against a real dlop-offloader: batches arrive by UCX in the
// caller's buffer bit-identical to the pipeline run locally; skip and raise
// policies; cancel; stats; refused configurations; a daemon killed mid-batch
// is reported as kPeerDead; a vanished client costs others nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.hpp"
#include "core/process.hpp"
#include "daemon_harness.hpp"
#include "media/codec.hpp"
#include "media/image_pipeline.hpp"
#include "media/source.hpp"
#include "offload/offload_client.hpp"
#include "transport/ucx_worker.hpp"

namespace dlop::offload {
namespace {

using namespace std::chrono_literals;
using protocol::MsgType;
using test::DaemonProcess;
using test::RawConn;

constexpr const char* kSpec = R"({"ops": [
  {"op": "random_resized_crop", "size": 32}, {"op": "hflip", "p": 0.5},
  {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}], "on_error": "%s"})";

std::string spec(const char* policy = "raise") {
  char buf[512];
  std::snprintf(buf, sizeof(buf), kSpec, policy);
  return buf;
}

// 3 classes x 6 images of varied sizes, JPEG and PNG.
void make_folder(const std::filesystem::path& root) {
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 6; ++i) {
      const media::Image img = test::make_image(40 + 7 * i, 50 + 5 * c, static_cast<std::uint32_t>(c * 10 + i));
      const auto dir = root / ("class" + std::to_string(c));
      if (i % 3 == 2) {
        test::write_file(dir / ("img" + std::to_string(i) + ".png"), media::encode_png(img));
      } else {
        test::write_file(dir / ("img" + std::to_string(i) + ".jpg"), media::encode_jpeg(img, 85));
      }
    }
  }
}

struct Buffer {
  explicit Buffer(std::size_t n) : bytes(n, std::byte{0xAB}) {}
  std::vector<std::byte> bytes;
};

// What the daemon must have sent: the pipeline run here on the same source.
void expect_batch_equals_local(const Buffer& got, const BatchLayout& layout, const media::Source& source,
                               const std::vector<std::uint64_t>& indices, std::uint64_t seed, std::uint64_t epoch,
                               const Completion& c) {
  const media::ImagePipeline p = media::ImagePipeline::from_json(spec());
  std::vector<std::byte> images(indices.size() * layout.sample_bytes);
  std::vector<std::int64_t> labels(indices.size());
  const media::BatchResult local = p.run_batch(source, indices, seed, epoch, images, labels);
  ASSERT_EQ(c.status, Completion::Status::kReady) << c.error;
  ASSERT_EQ(c.count, local.count);
  EXPECT_EQ(std::memcmp(got.bytes.data(), images.data(), local.count * layout.sample_bytes), 0)
      << "images differ from the local pipeline";
  EXPECT_EQ(std::memcmp(got.bytes.data() + layout.labels_offset, labels.data(), local.count * 8), 0)
      << "labels differ";
}

Completion wait_one(OffloadClient& client) {
  auto c = client.wait(30s);
  if (!c) throw std::runtime_error("no completion within 30 s");
  return *c;
}

class OffloadClientTest : public ::testing::Test {
 protected:
  void SetUp() override { make_folder(data_.path() / "train"); }
  std::string folder() const { return (data_.path() / "train").string(); }
  test::TempDir data_;
};

// Direct writes (the default on one host) and UCX (what other hosts use).
class OffloadClientPathTest : public OffloadClientTest, public ::testing::WithParamInterface<bool> {};

INSTANTIATE_TEST_SUITE_P(DirectAndUcx, OffloadClientPathTest, ::testing::Bool(), test::direct_or_ucx);

TEST_P(OffloadClientPathTest, BatchesAreBitIdenticalToTheLocalPipeline) {
  DaemonProcess d(2);
  OffloadClient client("127.0.0.1", d.port(), test::kToken,
                       {.name = "bit-exact", .timeout = 30s, .worker = nullptr, .direct = GetParam()});
  const BatchLayout& layout = client.configure({folder(), spec(), 1234, 8});
  EXPECT_EQ(layout.direct, GetParam());
  EXPECT_EQ(layout.dataset_size, 18u);
  EXPECT_EQ(layout.classes, 3u);
  EXPECT_EQ(layout.sample_bytes, 3u * 32 * 32 * 4);
  EXPECT_EQ(layout.labels_offset % 64, 0u);

  const std::vector<std::vector<std::uint64_t>> batches = {{0, 5, 17, 3, 9, 11, 2, 14}, {1, 4, 16}, {8, 7, 6, 13, 12}};
  std::vector<Buffer> buffers;
  for (std::size_t b = 0; b < batches.size(); ++b) buffers.emplace_back(layout.batch_bytes);
  for (std::size_t b = 0; b < batches.size(); ++b) {
    client.produce(100 + b, /*epoch=*/3, /*batch=*/b, batches[b], buffers[b].bytes.data(), layout.batch_bytes);
  }
  EXPECT_EQ(client.in_flight(), 3u);
  const std::unique_ptr<media::Source> local = media::open_source(folder());
  for (std::size_t k = 0; k < batches.size(); ++k) {
    const Completion c = wait_one(client);
    ASSERT_GE(c.lease, 100u);
    const std::size_t b = c.lease - 100;
    EXPECT_EQ(c.batch, b);
    EXPECT_EQ(c.bytes, layout.labels_offset + batches[b].size() * 8);
    expect_batch_equals_local(buffers[b], layout, *local, batches[b], 1234, 3, c);
  }
  EXPECT_EQ(client.in_flight(), 0u);

  // Every stage reported apart: samples for read/decode/augment/collate,
  // batches for batch and send, each with time spent.
  const protocol::Stats stats = client.stats();
  std::vector<std::string> names;
  for (const auto& s : stats.stages) names.push_back(s.name);
  ASSERT_EQ(names, (std::vector<std::string>{"read", "decode", "augment", "collate", "batch", "send"}));
  const std::size_t samples = batches[0].size() + batches[1].size() + batches[2].size();
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(stats.stages[i].items, samples) << names[i];
    EXPECT_GT(stats.stages[i].seconds, 0.0) << names[i];
  }
  EXPECT_EQ(stats.stages[3].bytes, samples * layout.sample_bytes);
  EXPECT_EQ(stats.stages[4].items, 3u);
  EXPECT_EQ(stats.stages[5].items, 3u);
  EXPECT_GT(stats.stages[4].seconds, 0.0);
}

// A worker address the daemon's UCX cannot reach (here: only the "self"
// transport, which reaches nothing outside its process) is refused as the
// daemon's own failure, kInternal, which a LeaseManager tries again; the
// daemon goes on serving others.
TEST_F(OffloadClientTest, AnUnreachableWorkerIsRefusedAsTheDaemonsFailure) {
  DaemonProcess d(1);
  const transport::UcxWorker only_self({.wakeup = false, .ucx_config = {{"TLS", "self"}}});
  const auto address = only_self.address();
  RawConn c(d.port());
  ASSERT_TRUE(c.authenticate().has_value());
  const protocol::Configure m{{address.begin(), address.end()}, host_identity(), folder(), spec(), {}, 1, 4};
  c.write(c.writer.encode(MsgType::kConfigure, protocol::encode(m)));
  const auto f = c.read_frame();
  ASSERT_TRUE(f.has_value() && f->type == MsgType::kError);
  const auto e = protocol::decode<protocol::ErrorMsg>(f->payload);
  EXPECT_EQ(e.code, protocol::ErrorCode::kInternal) << e.message;
  EXPECT_NE(e.message.find("ucp_ep_create"), std::string::npos) << e.message;

  OffloadClient good("127.0.0.1", d.port(), test::kToken, {.timeout = 30s});
  EXPECT_EQ(good.configure({folder(), spec(), 1, 4}).dataset_size, 18u);
}

// A daemon writes into a process only once that process showed it, from its
// own memory, the random nonce of this connection's WELCOME: a pid that is
// not the sender's, or a wrong nonce, leaves the connection on UCX, and a
// PRODUCE that names an address there is refused (and one without an
// address on a direct connection).
TEST_F(OffloadClientTest, DirectWritesNeedProofOfThePid) {
  DaemonProcess d(1);
  const auto worker = OffloadClient::make_worker();
  const auto address = worker->address();
  // The daemon connects to this worker at CONFIGURE: keep it answering.
  std::atomic<bool> stop{false};
  std::thread progress([&] {
    while (!stop) {
      if (!worker->progress()) std::this_thread::sleep_for(1ms);
    }
  });
  protocol::Nonce held{};
  const auto configure = [&](RawConn& c, std::uint32_t pid, bool right_nonce) {
    const auto welcome = c.authenticate();
    EXPECT_TRUE(welcome.has_value());
    held = welcome ? welcome->direct_nonce : protocol::Nonce{};
    if (!right_nonce) held[5] ^= 1;
    const protocol::Configure m{{address.begin(), address.end()}, host_identity(), folder(), spec(), {}, 1, 4, pid,
                                reinterpret_cast<std::uintptr_t>(held.data())};
    c.write(c.writer.encode(MsgType::kConfigure, protocol::encode(m)));
    const auto f = c.read_frame();
    EXPECT_TRUE(f.has_value() && f->type == MsgType::kConfigured)
        << (f && f->type == MsgType::kError ? protocol::decode<protocol::ErrorMsg>(f->payload).message : "no answer");
    return f && f->type == MsgType::kConfigured && protocol::decode<protocol::Configured>(f->payload).direct;
  };
  const auto refused = [](RawConn& c, std::uint64_t address_field, const std::string& why, std::uint64_t lease = 7) {
    const protocol::Produce p{lease, 0, 0, {0, 1}, address_field};
    c.write(c.writer.encode(MsgType::kProduce, protocol::encode(p)));
    const auto f = c.read_frame();
    ASSERT_TRUE(f.has_value() && f->type == MsgType::kError);
    const auto e = protocol::decode<protocol::ErrorMsg>(f->payload);
    EXPECT_EQ(e.code, protocol::ErrorCode::kBadRequest);
    EXPECT_NE(e.message.find(why), std::string::npos) << e.message;
  };
  std::vector<std::byte> buffer(1 << 20);
  const auto buffer_address = reinterpret_cast<std::uintptr_t>(buffer.data());

  RawConn mine(d.port());
  EXPECT_TRUE(configure(mine, static_cast<std::uint32_t>(::getpid()), true));
  refused(mine, 0, "without a buffer address");

  RawConn wrong_nonce(d.port());
  EXPECT_FALSE(configure(wrong_nonce, static_cast<std::uint32_t>(::getpid()), false));
  refused(wrong_nonce, buffer_address, "not direct");
  // Over UCX a lease id is a tag's low 48 bits: a larger one is refused, not sent under another's tag.
  refused(wrong_nonce, 0, "above 2^48 - 1", std::uint64_t{1} << 48);

  // A process of ours with our memory layout (forked before this nonce existed).
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  RawConn other(d.port());
  EXPECT_FALSE(configure(other, static_cast<std::uint32_t>(child), true));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  refused(other, buffer_address, "not direct");
  stop = true;
  progress.join();
}

TEST_F(OffloadClientTest, RecordFileSourceGivesTheSameBatches) {
  const auto records = data_.path() / "train.dlrec";
  media::pack_image_folder(folder(), records);
  DaemonProcess d(1);
  OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 30s});
  const BatchLayout& layout = client.configure({records.string(), spec(), 99, 4});
  Buffer buf(layout.batch_bytes);
  const std::vector<std::uint64_t> idx = {17, 0, 9, 4};
  client.produce(1, 0, 0, idx, buf.bytes.data(), layout.batch_bytes);
  expect_batch_equals_local(buf, layout, *media::open_source(folder()), idx, 99, 0, wait_one(client));
}

TEST_F(OffloadClientTest, SkipAndRaisePolicies) {
  test::write_file(data_.path() / "train" / "class1" / "zz_corrupt.jpg", {0xFF, 0xD8, 0xFF, 0x00, 0x01});
  const std::unique_ptr<media::Source> local = media::open_source(folder());
  std::uint64_t bad = 0;
  while (local->name(bad).find("zz_corrupt") == std::string::npos) ++bad;
  DaemonProcess d(2);
  {
    OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 30s});
    const BatchLayout& layout = client.configure({folder(), spec("skip"), 5, 4});
    Buffer buf(layout.batch_bytes);
    client.produce(7, 0, 0, std::vector<std::uint64_t>{0, bad, 2}, buf.bytes.data(), layout.batch_bytes);
    const Completion c = wait_one(client);
    ASSERT_EQ(c.status, Completion::Status::kReady) << c.error;
    EXPECT_EQ(c.count, 2u);
    ASSERT_EQ(c.skipped.size(), 1u);
    EXPECT_EQ(c.skipped[0].index, bad);
  }
  OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 30s});
  const BatchLayout& layout = client.configure({folder(), spec("raise"), 5, 4});
  Buffer buf(layout.batch_bytes);
  client.produce(7, 0, 0, std::vector<std::uint64_t>{0, bad}, buf.bytes.data(), layout.batch_bytes);
  const Completion c = wait_one(client);
  EXPECT_EQ(c.status, Completion::Status::kFailed);
  EXPECT_EQ(c.error_code, protocol::ErrorCode::kSample);
  EXPECT_NE(c.error.find("zz_corrupt"), std::string::npos) << c.error;
  // The connection carries on.
  client.produce(8, 0, 1, std::vector<std::uint64_t>{1}, buf.bytes.data(), layout.batch_bytes);
  EXPECT_EQ(wait_one(client).status, Completion::Status::kReady);
}

TEST_F(OffloadClientTest, RefusedRequestsFailOnlyThemselves) {
  DaemonProcess d(1);
  OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 30s});
  EXPECT_THROW(client.configure({folder(), R"({"ops": [{"op": "nope"}]})", 0, 4}), Error);
  EXPECT_THROW(client.configure({(data_.path() / "missing").string(), spec(), 0, 4}), Error);
  EXPECT_THROW(client.configure({folder(), R"({"ops": [{"op": "hflip"}]})", 0, 4}), Error);  // no fixed size
  const BatchLayout& layout = client.configure({folder(), spec(), 0, 4});
  Buffer buf(layout.batch_bytes);
  client.produce(1, 0, 0, std::vector<std::uint64_t>{0, 1000}, buf.bytes.data(), layout.batch_bytes);
  Completion c = wait_one(client);
  EXPECT_EQ(c.status, Completion::Status::kFailed);
  EXPECT_EQ(c.error_code, protocol::ErrorCode::kInvalidArgument);
  client.produce(2, 0, 0, std::vector<std::uint64_t>{0, 1, 2, 3, 4}, buf.bytes.data(), layout.batch_bytes);
  EXPECT_EQ(wait_one(client).error_code, protocol::ErrorCode::kInvalidArgument);  // more than the batch size
  EXPECT_THROW(client.produce(3, 0, 0, std::vector<std::uint64_t>{0}, buf.bytes.data(), 16), Error);
  client.produce(3, 0, 0, std::vector<std::uint64_t>{0}, buf.bytes.data(), layout.batch_bytes);
  EXPECT_EQ(wait_one(client).status, Completion::Status::kReady);
}

TEST_F(OffloadClientTest, CancelGivesEveryLeaseOneCompletion) {
  DaemonProcess d(1);
  OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 30s});
  const BatchLayout& layout = client.configure({folder(), spec(), 0, 8});
  std::vector<Buffer> buffers;
  for (int i = 0; i < 6; ++i) buffers.emplace_back(layout.batch_bytes);
  const std::vector<std::uint64_t> idx = {0, 1, 2, 3, 4, 5, 6, 7};
  for (std::uint64_t l = 1; l <= 6; ++l) client.produce(l, 0, l, idx, buffers[l - 1].bytes.data(), layout.batch_bytes);
  client.cancel(6);  // queued behind five: canceled before it is made
  client.cancel(1);  // probably being made already: canceled or ready
  std::map<std::uint64_t, Completion::Status> seen;
  for (int i = 0; i < 6; ++i) {
    const Completion c = wait_one(client);
    EXPECT_FALSE(seen.contains(c.lease));
    seen[c.lease] = c.status;
  }
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen[6], Completion::Status::kCanceled);
  for (std::uint64_t l = 2; l <= 5; ++l) EXPECT_EQ(seen[l], Completion::Status::kReady);
  EXPECT_FALSE(client.wait(200ms).has_value());
}

TEST_F(OffloadClientTest, VanishedClientCostsOthersNothing) {
  DaemonProcess d(1);
  OffloadClient keeper("127.0.0.1", d.port(), test::kToken, {.name = "keeper", .timeout = 30s});
  const BatchLayout& layout = keeper.configure({folder(), spec(), 0, 8});
  {
    OffloadClient leaver("127.0.0.1", d.port(), test::kToken, {.name = "leaver", .timeout = 30s});
    leaver.configure({folder(), spec(), 0, 8});
    std::vector<Buffer> bufs;
    for (int i = 0; i < 4; ++i) bufs.emplace_back(layout.batch_bytes);
    for (std::uint64_t l = 1; l <= 4; ++l) {
      leaver.produce(l, 0, l, std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}, bufs[l - 1].bytes.data(),
                     layout.batch_bytes);
    }
  }  // gone with four leases open
  Buffer buf(layout.batch_bytes);
  const std::vector<std::uint64_t> idx = {9, 8, 7};
  keeper.produce(1, 1, 0, idx, buf.bytes.data(), layout.batch_bytes);
  expect_batch_equals_local(buf, layout, *media::open_source(folder()), idx, 0, 1, wait_one(keeper));
  EXPECT_TRUE(d.running());
}

// A batch of tens of MiB (UCX's rendezvous path, in pieces over TCP) lands
// whole; the daemon's send stage reports its bandwidth.
TEST_F(OffloadClientTest, LargeBatchArrivesWhole) {
  const char* big_spec = R"({"ops": [{"op": "random_resized_crop", "size": 224}]})";
  DaemonProcess d(2);
  OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 60s});
  const BatchLayout& layout = client.configure({folder(), big_spec, 3, 64});
  EXPECT_GT(layout.batch_bytes, 36u << 20);
  std::vector<std::uint64_t> idx(64);
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = (i * 7) % 18;
  Buffer buf(layout.batch_bytes);
  client.produce(1, 2, 0, idx, buf.bytes.data(), layout.batch_bytes);
  const auto c = client.wait(60s);
  ASSERT_TRUE(c.has_value());
  ASSERT_EQ(c->status, Completion::Status::kReady) << c->error;
  const media::ImagePipeline p = media::ImagePipeline::from_json(big_spec);
  std::vector<std::byte> images(idx.size() * layout.sample_bytes);
  std::vector<std::int64_t> labels(idx.size());
  p.run_batch(*media::open_source(folder()), idx, 3, 2, images, labels);
  EXPECT_EQ(std::memcmp(buf.bytes.data(), images.data(), images.size()), 0);
  EXPECT_EQ(std::memcmp(buf.bytes.data() + layout.labels_offset, labels.data(), labels.size() * 8), 0);
  const auto stats = client.stats();
  const auto& send = stats.stages[5];
  EXPECT_EQ(send.name, "send");
  EXPECT_EQ(send.bytes, c->bytes);
  std::printf("send stage: %.1f MiB in %.1f ms (%.2f GB/s); batch %.1f ms\n", send.bytes / 1048576.0,
              send.seconds * 1e3, send.bytes / send.seconds * 1e-9, stats.stages[4].seconds * 1e3);
}

TEST_F(OffloadClientTest, KilledDaemonIsPeerDead) {
  // Big images and one thread, so the batch is still being made when killed.
  for (int i = 0; i < 8; ++i) {
    test::write_file(data_.path() / "big" / "c" / ("b" + std::to_string(i) + ".png"),
                     media::encode_png(test::make_image(1200, 1600, static_cast<std::uint32_t>(i))));
  }
  DaemonProcess d(1);
  OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 30s});
  const BatchLayout& layout = client.configure({(data_.path() / "big").string(), spec(), 0, 8});
  Buffer buf(layout.batch_bytes);
  client.produce(42, 0, 0, std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}, buf.bytes.data(), layout.batch_bytes);
  std::this_thread::sleep_for(50ms);
  d.kill(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  try {
    while (client.wait(10s)) {
    }
    ADD_FAILURE() << "no error after the daemon was killed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kPeerDead) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(client.lost_leases(), std::vector<std::uint64_t>{42});
  EXPECT_EQ(client.in_flight(), 0u);
  EXPECT_THROW(client.ping(), Error);  // and every call after
}

}  // namespace
}  // namespace dlop::offload
