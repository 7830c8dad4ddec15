// A real dlop-offloader's drain and metrics. SIGTERM while a batch is being
// made: the batch is finished and delivered, queued and new leases are
// refused (ERROR kBusy) and made by another daemon, new connections are
// refused, and the daemon exits 0; the trainer's epoch stays exactly once. A
// batch that never ends is dropped after --drain-timeout (exit 3), as on a
// second signal. The metrics endpoint answers Prometheus text whose counters
// move with the batches; a taken metrics port fails the start, naming it.
//
// A batch is held "being made" by a FIFO among the images: the daemon's read
// blocks in open() until the test opens the FIFO's other end, and the sample
// then fails to read (skipped under the skip policy).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.hpp"
#include "daemon_harness.hpp"
#include "media/codec.hpp"
#include "media/image_pipeline.hpp"
#include "media/source.hpp"
#include "offload/lease_manager.hpp"
#include "offload/offload_client.hpp"

namespace dlop::offload {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::DaemonProcess;

constexpr const char* kSpec = R"({"ops": [{"op": "random_resized_crop", "size": 24}, {"op": "hflip", "p": 0.5},
  {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}], "on_error": "skip"})";
constexpr std::uint64_t kSeed = 77;
constexpr std::uint32_t kBatch = 4;
constexpr std::uint64_t kSamples = 27;  // 3 classes of 9

// "HTTP/1.0 200 OK" and the body, of a request to 127.0.0.1:port.
std::pair<std::string, std::string> http(std::uint16_t port, const std::string& request) {
  test::RawConn c(port);
  const std::vector<std::uint8_t> bytes(request.begin(), request.end());
  if (!c.write(bytes)) return {};
  std::string response;
  std::uint8_t buf[4096];
  pollfd p{c.fd(), POLLIN, 0};
  while (::poll(&p, 1, 10000) > 0) {
    const ssize_t n = ::recv(c.fd(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    response.append(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
  }
  const auto head_end = response.find("\r\n\r\n");
  if (head_end == std::string::npos) return {response, ""};
  return {response.substr(0, response.find("\r\n")), response.substr(head_end + 4)};
}

// Parses the exposition text strictly (the subset a daemon writes: HELP and
// TYPE before each sample, no labels, counters named *_total); a line that
// breaks a rule fails the test.
// A metric name: [a-zA-Z_:][a-zA-Z0-9_:]* (no std::regex: GCC 12 warns inside
// it under ASan, and warnings are errors).
bool metric_name(const std::string& name) {
  const auto first = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; };
  return !name.empty() && first(name[0]) &&
         std::all_of(name.begin() + 1, name.end(),
                     [&](char c) { return first(c) || std::isdigit(static_cast<unsigned char>(c)); });
}

std::map<std::string, double> parse_prometheus(const std::string& text) {
  std::map<std::string, double> values;
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  EXPECT_TRUE(!text.empty() && text.back() == '\n') << "the text must end with a newline";
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0) {
      const std::string rest = line.substr(7);
      const std::string name = rest.substr(0, rest.find(' '));
      EXPECT_TRUE(metric_name(name)) << line;
      EXPECT_TRUE(helped.insert(name).second) << "a second HELP: " << line;
      EXPECT_GT(rest.size(), name.size() + 1) << "HELP without text: " << line;
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream fields(line.substr(7));
      std::string name, type, extra;
      fields >> name >> type >> extra;
      EXPECT_TRUE(metric_name(name)) << line;
      EXPECT_TRUE(type == "counter" || type == "gauge") << line;
      EXPECT_TRUE(extra.empty()) << line;
      EXPECT_TRUE(types.emplace(name, type).second) << "a second TYPE: " << line;
      EXPECT_FALSE(values.contains(name)) << "TYPE after its sample: " << line;
      EXPECT_TRUE(type != "counter" || name.ends_with("_total")) << line;
      continue;
    }
    EXPECT_FALSE(line.empty() || line[0] == '#') << "unexpected line: '" << line << "'";
    const auto space = line.find(' ');
    if (space == std::string::npos) {
      ADD_FAILURE() << "a sample without a value: " << line;
      continue;
    }
    // A sample is keyed by its name and labels as written: name{stage="read"}.
    const std::string key = line.substr(0, space), value = line.substr(space + 1);
    const std::string name = key.substr(0, key.find('{'));
    EXPECT_TRUE(metric_name(name)) << line;
    EXPECT_TRUE(key == name || key.ends_with("\"}")) << line;
    EXPECT_TRUE(types.contains(name)) << "a sample without TYPE: " << line;
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    EXPECT_TRUE(!value.empty() && *end == '\0' && std::isfinite(v)) << line;
    EXPECT_TRUE(values.emplace(key, v).second) << "a second sample: " << line;
  }
  return values;
}

std::map<std::string, double> scrape(std::uint16_t port) {
  const auto [status, body] = http(port, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(status, "HTTP/1.0 200 OK");
  return parse_prometheus(body);
}

double metric(std::uint16_t port, const std::string& name) {
  const auto values = scrape(port);
  const auto it = values.find(name);
  if (it == values.end()) {
    ADD_FAILURE() << "no metric " << name;
    return -1;
  }
  return it->second;
}

// Polls the daemon's metrics until `done` holds; false after `timeout`.
bool wait_metrics(std::uint16_t port, const std::function<bool(const std::map<std::string, double>&)>& done,
                  std::chrono::milliseconds timeout = 20s) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (done(scrape(port))) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// Lets the daemon blocked on the FIFO go on: its open() returns, and the
// sample fails to read (a FIFO has no size).
void release(const std::filesystem::path& fifo) {
  const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
}

std::string read_text(const std::filesystem::path& path) {
  const auto bytes = test::read_file(path);
  return {bytes.begin(), bytes.end()};
}

class DaemonDrainTest : public ::testing::Test {
 protected:
  // Writes the 27 images under root/train, `fifo_index` (if any) as a FIFO.
  static void write_images(const std::filesystem::path& root, std::optional<std::uint64_t> fifo_index = {}) {
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 9; ++i) {
        const auto path = root / "train" / ("c" + std::to_string(c)) / ("i" + std::to_string(i) + ".jpg");
        if (fifo_index == static_cast<std::uint64_t>(c * 9 + i)) {
          std::filesystem::create_directories(path.parent_path());
          ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
          continue;
        }
        const media::Image img = test::make_image(30 + 3 * i, 36 + 4 * c, static_cast<std::uint32_t>(c * 100 + i));
        test::write_file(path, media::encode_jpeg(img, 85));
      }
    }
  }
  static std::filesystem::path fifo_path(const std::filesystem::path& root, std::uint64_t index) {
    return root / "train" / ("c" + std::to_string(index / 9)) / ("i" + std::to_string(index % 9) + ".jpg");
  }

  // The batch as the pipeline makes it here: images then labels.
  static std::vector<std::byte> local_batch(const std::filesystem::path& folder,
                                            const std::vector<std::uint64_t>& indices, std::uint64_t epoch) {
    return test::local_batch(folder.string(), kSpec, kSeed, 24, indices, epoch);
  }

  test::TempDir dir_;
};

struct Buffer {
  explicit Buffer(std::size_t n) : bytes(n) {}
  std::vector<std::byte> bytes;
};

Completion wait_one(OffloadClient& client, std::chrono::milliseconds timeout = 20s) {
  auto c = client.wait(timeout);
  if (!c) throw std::runtime_error("no completion in time");
  return *c;
}

TEST_F(DaemonDrainTest, MetricsAreParseablePrometheusTextThatMovesWithTheBatches) {
  write_images(dir_.path());
  DaemonProcess d(1, {"--metrics-port", "0"});
  ASSERT_NE(d.metrics_port(), 0) << "no metrics port on the ready line";
  ASSERT_NE(d.metrics_port(), d.port());
  auto before = scrape(d.metrics_port());
  for (const char* name :
       {"dlop_offloader_busy_ratio", "dlop_offloader_busy_seconds_total", "dlop_offloader_batches_made_total",
        "dlop_offloader_samples_made_total", "dlop_offloader_batches_sent_total", "dlop_offloader_batches_refused_total",
        "dlop_offloader_batches_in_progress", "dlop_offloader_leases_in_progress", "dlop_offloader_draining",
        "dlop_offloader_compute_threads", "dlop_offloader_connections_open", "dlop_offloader_batches_failed_total",
        "dlop_offloader_samples_skipped_total", "dlop_offloader_leases_canceled_total",
        "dlop_offloader_connections_accepted_total", "dlop_offloader_auth_failures_total",
        "dlop_offloader_protocol_errors_total", "dlop_offloader_stage_bytes_total{stage=\"read\"}",
        "dlop_offloader_stage_items_total{stage=\"send\"}", "dlop_offloader_stage_seconds_total{stage=\"decode\"}"}) {
    EXPECT_TRUE(before.contains(name)) << name;
  }
  EXPECT_EQ(before["dlop_offloader_batches_made_total"], 0);
  EXPECT_EQ(before["dlop_offloader_busy_seconds_total"], 0);
  EXPECT_EQ(before["dlop_offloader_draining"], 0);
  EXPECT_EQ(before["dlop_offloader_compute_threads"], 1);

  LeaseOptions o;
  o.config = {(dir_.path() / "train").string(), kSpec, kSeed, kBatch};
  o.token = test::kToken;
  o.connect_timeout = 30s;
  LeaseManager m(o);
  m.add_daemon("127.0.0.1", d.port());
  m.set_epoch(0);
  std::size_t batches = 0;
  while (auto b = m.next()) {
    m.release(b->slot);
    ++batches;
  }
  ASSERT_EQ(batches, 7u);
  // Levels are a pass of the daemon's loop behind its answers.
  EXPECT_TRUE(wait_metrics(d.metrics_port(), [](const auto& v) {
    return v.at("dlop_offloader_leases_in_progress") == 0 && v.at("dlop_offloader_batches_in_progress") == 0;
  }, 5s));
  const auto after = scrape(d.metrics_port());
  EXPECT_EQ(after.at("dlop_offloader_batches_made_total"), 7);
  EXPECT_EQ(after.at("dlop_offloader_batches_sent_total"), 7);
  EXPECT_EQ(after.at("dlop_offloader_samples_made_total"), static_cast<double>(kSamples));
  EXPECT_GT(after.at("dlop_offloader_busy_seconds_total"), 0);
  EXPECT_GT(after.at("dlop_offloader_busy_ratio"), 0) << "batches were made within the window";
  EXPECT_LE(after.at("dlop_offloader_busy_ratio"), 1);
  EXPECT_EQ(after.at("dlop_offloader_leases_in_progress"), 0);
  EXPECT_EQ(after.at("dlop_offloader_batches_in_progress"), 0);
  EXPECT_EQ(after.at("dlop_offloader_connections_open"), 1);
  EXPECT_EQ(after.at("dlop_offloader_batches_refused_total"), 0);
  // Every sample read once, each whole: the bytes read are the files' sizes.
  std::uintmax_t files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_.path() / "train")) {
    if (e.is_regular_file()) files += e.file_size();
  }
  EXPECT_EQ(after.at("dlop_offloader_stage_items_total{stage=\"read\"}"), static_cast<double>(kSamples));
  EXPECT_EQ(after.at("dlop_offloader_stage_bytes_total{stage=\"read\"}"), static_cast<double>(files));
  EXPECT_GT(after.at("dlop_offloader_stage_bytes_total{stage=\"decode\"}"), 0);

  // Anything but GET /metrics is answered, and refused.
  EXPECT_EQ(http(d.metrics_port(), "GET / HTTP/1.0\r\n\r\n").first, "HTTP/1.0 404 Not Found");
  EXPECT_EQ(http(d.metrics_port(), "POST /metrics HTTP/1.0\r\n\r\n").first, "HTTP/1.0 405 Method Not Allowed");
  EXPECT_EQ(http(d.metrics_port(), "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n").first, "HTTP/1.0 200 OK");
  // A peer that sends nothing holds the endpoint for 2 s at most.
  test::RawConn silent(d.metrics_port());
  EXPECT_EQ(metric(d.metrics_port(), "dlop_offloader_batches_made_total"), 7);
}

TEST_F(DaemonDrainTest, ATakenMetricsPortFailsTheStartNamingIt) {
  DaemonProcess first(1, {"--metrics-port", "0"});
  const std::string port = std::to_string(first.metrics_port());
  const auto err = dir_.path() / "stderr";
  try {
    DaemonProcess second(1, {"--metrics-port", port}, {}, "127.0.0.1:0", {}, {}, err);
    ADD_FAILURE() << "a daemon started on a taken metrics port";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("did not start"), std::string::npos) << e.what();
  }
  const std::string text = read_text(err);
  EXPECT_NE(text.find("--metrics-port " + port + ": port " + port + " on 127.0.0.1 is taken"), std::string::npos)
      << text;
  EXPECT_TRUE(first.running());
}

// The daemon's half of a drain, seen by one client: the batch being made
// arrives, the queued and the new leases are refused at once, nobody new gets
// in, and the daemon closes and exits 0 once its last answer is out.
TEST_F(DaemonDrainTest, SigtermFinishesTheBatchBeingMadeAndRefusesTheRest) {
  constexpr std::uint64_t kFifo = 5;
  write_images(dir_.path(), kFifo);
  DaemonProcess d(1, {"--metrics-port", "0"});
  OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 30s});
  const BatchLayout& layout = client.configure({(dir_.path() / "train").string(), kSpec, kSeed, kBatch});
  Buffer a(layout.batch_bytes), b(layout.batch_bytes), c(layout.batch_bytes);
  client.produce(1, 0, 0, std::vector<std::uint64_t>{4, kFifo, 6, 7}, a.bytes.data(), layout.batch_bytes);
  client.produce(2, 0, 1, std::vector<std::uint64_t>{8, 9}, b.bytes.data(), layout.batch_bytes);
  ASSERT_TRUE(wait_metrics(d.metrics_port(), [](const auto& v) {
    return v.at("dlop_offloader_batches_in_progress") == 1 && v.at("dlop_offloader_leases_in_progress") == 2;
  })) << "lease 1 is not being made";

  d.kill(SIGTERM);
  // Lease 2 was queued: refused now, while lease 1 is still being made.
  const Completion refused = wait_one(client);
  EXPECT_EQ(refused.lease, 2u);
  EXPECT_EQ(refused.status, Completion::Status::kFailed);
  EXPECT_EQ(refused.error_code, protocol::ErrorCode::kBusy);
  EXPECT_NE(refused.error.find("draining"), std::string::npos) << refused.error;
  // A new lease too.
  client.produce(3, 0, 2, std::vector<std::uint64_t>{10}, c.bytes.data(), layout.batch_bytes);
  const Completion refused_new = wait_one(client);
  EXPECT_EQ(refused_new.lease, 3u);
  EXPECT_EQ(refused_new.error_code, protocol::ErrorCode::kBusy);
  auto v = scrape(d.metrics_port());
  EXPECT_EQ(v.at("dlop_offloader_draining"), 1);
  EXPECT_EQ(v.at("dlop_offloader_batches_refused_total"), 2);
  EXPECT_EQ(v.at("dlop_offloader_batches_in_progress"), 1);
  // Nobody new gets in.
  EXPECT_THROW(OffloadClient("127.0.0.1", d.port(), test::kToken, {.timeout = 2s}), Error);
  EXPECT_TRUE(d.running());

  release(fifo_path(dir_.path(), kFifo));
  const Completion made = wait_one(client);
  EXPECT_EQ(made.lease, 1u);
  ASSERT_EQ(made.status, Completion::Status::kReady) << made.error;
  EXPECT_EQ(made.count, 3u);
  ASSERT_EQ(made.skipped.size(), 1u);
  EXPECT_EQ(made.skipped[0].index, kFifo);
  const auto want = local_batch(dir_.path() / "train", {4, 6, 7}, 0);
  const std::size_t images = 3 * layout.sample_bytes;
  EXPECT_EQ(std::memcmp(a.bytes.data(), want.data(), images), 0) << "the drained batch's images differ";
  EXPECT_EQ(std::memcmp(a.bytes.data() + layout.labels_offset, want.data() + images, 3 * 8), 0);

  const auto status = d.wait_exit(10s);
  ASSERT_TRUE(status.has_value()) << "the drained daemon did not exit";
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  // Its side of the connection is closed; nothing was left open.
  try {
    EXPECT_FALSE(client.wait(2s).has_value());
    ADD_FAILURE() << "the connection of a drained daemon is still open";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kPeerDead) << e.what();
    EXPECT_EQ(std::string(e.what()).find("leases lost"), std::string::npos) << e.what();
  }
}

TEST_F(DaemonDrainTest, ABatchPastTheDrainTimeoutIsDroppedAndTheDaemonExits) {
  constexpr std::uint64_t kFifo = 3;
  write_images(dir_.path(), kFifo);
  const auto err = dir_.path() / "stderr";
  DaemonProcess d(1, {"--metrics-port", "0", "--drain-timeout", "1"}, {}, "127.0.0.1:0", {}, {}, err);
  OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 30s});
  const BatchLayout& layout = client.configure({(dir_.path() / "train").string(), kSpec, kSeed, kBatch});
  Buffer a(layout.batch_bytes);
  client.produce(41, 0, 0, std::vector<std::uint64_t>{kFifo, 1}, a.bytes.data(), layout.batch_bytes);
  ASSERT_TRUE(wait_metrics(d.metrics_port(),
                           [](const auto& v) { return v.at("dlop_offloader_batches_in_progress") == 1; }));
  const auto start = Clock::now();
  d.kill(SIGTERM);
  const auto status = d.wait_exit(15s);  // the FIFO is never opened: the batch never ends
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_TRUE(status.has_value()) << "the daemon kept draining past --drain-timeout";
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 3);
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 10);
  const std::string text = read_text(err);
  EXPECT_NE(text.find("--drain-timeout"), std::string::npos) << text;
  EXPECT_NE(text.find("1 leases in flight dropped"), std::string::npos) << text;
  EXPECT_NE(text.find(": lease 41"), std::string::npos) << text;
  // The client learns that its lease is lost: a LeaseManager leases it again.
  try {
    (void)client.wait(5s);
    ADD_FAILURE() << "the lease of a daemon that exited did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kPeerDead) << e.what();
    EXPECT_NE(std::string(e.what()).find("1 leases lost"), std::string::npos) << e.what();
  }
}

TEST_F(DaemonDrainTest, ASecondSignalCutsTheDrainShort) {
  constexpr std::uint64_t kFifo = 3;
  write_images(dir_.path(), kFifo);
  DaemonProcess d(1, {"--metrics-port", "0"});
  OffloadClient client("127.0.0.1", d.port(), test::kToken, {.timeout = 30s});
  const BatchLayout& layout = client.configure({(dir_.path() / "train").string(), kSpec, kSeed, kBatch});
  Buffer a(layout.batch_bytes);
  client.produce(1, 0, 0, std::vector<std::uint64_t>{kFifo}, a.bytes.data(), layout.batch_bytes);
  ASSERT_TRUE(wait_metrics(d.metrics_port(),
                           [](const auto& v) { return v.at("dlop_offloader_batches_in_progress") == 1; }));
  d.kill(SIGTERM);
  ASSERT_TRUE(wait_metrics(d.metrics_port(), [](const auto& v) { return v.at("dlop_offloader_draining") == 1; }));
  d.kill(SIGINT);
  const auto status = d.wait_exit(5s);
  ASSERT_TRUE(status.has_value()) << "a second signal did not stop the drain";
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 3);
}

// The trainer's side: two daemons, the first one SIGTERMed while it makes
// batch 0 with batch 2 queued behind. Batch 0 still comes from it; batch 2,
// refused, and everything after are made by the other; every sample of the
// plan arrives once, and no lease is lost.
TEST_F(DaemonDrainTest, EpochStaysExactlyOnceWhenADaemonDrainsMidBatch) {
  constexpr std::uint64_t kEpoch = 3;
  const EpochPlan plan{kSamples, kBatch, kSeed, true, false, 0, 1};
  const auto batches = plan.batches(kEpoch);
  // A sample of batch 0 that is not sample 0 (which a CONFIGURE may read).
  const std::uint64_t fifo = batches[0][0] != 0 ? batches[0][0] : batches[0][1];
  // The same folder twice, seen through each daemon's working directory: the
  // first daemon's copy has the FIFO.
  const auto a = dir_.path() / "a", b = dir_.path() / "b";
  write_images(a, fifo);
  write_images(b);
  const auto err = dir_.path() / "stderr";
  DaemonProcess d1(1, {"--metrics-port", "0"}, {}, "127.0.0.1:0", {}, a, err);
  DaemonProcess d2(1, {}, {}, "127.0.0.1:0", {}, b);

  LeaseOptions o;
  o.config = {"train", kSpec, kSeed, kBatch};  // relative: each daemon's own copy
  o.token = test::kToken;
  o.prefetch = 4;
  o.per_daemon = 2;
  o.connect_timeout = 30s;
  o.no_daemon_timeout = 30s;
  LeaseManager m(o);
  m.add_daemon("127.0.0.1", d1.port());  // leases go to the least busy, the first on a tie:
  m.add_daemon("127.0.0.1", d2.port());  // batches 0 and 2 to d1, 1 and 3 to d2
  m.set_epoch(kEpoch);

  // Meanwhile the consumer waits for batch 0 in next().
  std::thread drain([&] {
    const bool making = wait_metrics(d1.metrics_port(), [](const auto& v) {
      return v.at("dlop_offloader_batches_in_progress") == 1 && v.at("dlop_offloader_leases_in_progress") == 2;
    });
    EXPECT_TRUE(making) << "the first daemon is not making batch 0 with batch 2 queued";
    d1.kill(SIGTERM);
    EXPECT_TRUE(wait_metrics(d1.metrics_port(), [](const auto& v) {
      return v.at("dlop_offloader_draining") == 1 && v.at("dlop_offloader_batches_refused_total") >= 1;
    }));
    release(fifo_path(a, fifo));
  });

  std::vector<std::uint64_t> seen;
  std::uint64_t expected = 0;
  while (auto batch = m.next()) {
    EXPECT_EQ(batch->position, expected++) << "batches out of order";
    ASSERT_EQ(batch->indices, batches.at(batch->position));
    std::vector<std::uint64_t> made;
    for (const std::uint64_t i : batch->indices) {
      if (std::find(batch->skipped.begin(), batch->skipped.end(), i) == batch->skipped.end()) made.push_back(i);
    }
    if (batch->position == 0) {
      // Made by the drained daemon, the FIFO's sample skipped.
      EXPECT_EQ(batch->skipped, std::vector<std::uint64_t>{fifo});
    } else {
      EXPECT_TRUE(batch->skipped.empty());
    }
    const auto want = local_batch(b / "train", made, kEpoch);
    const std::size_t images = made.size() * m.layout().sample_bytes;
    EXPECT_EQ(batch->count, made.size());
    EXPECT_TRUE(std::memcmp(batch->images, want.data(), images) == 0 &&
                std::memcmp(batch->labels, want.data() + images, made.size() * 8) == 0)
        << "batch " << batch->position << " differs from the local pipeline";
    seen.insert(seen.end(), batch->indices.begin(), batch->indices.end());
    m.release(batch->slot);
  }
  drain.join();
  EXPECT_EQ(expected, batches.size());
  std::vector<std::uint64_t> all;
  for (const auto& x : batches) all.insert(all.end(), x.begin(), x.end());
  std::sort(all.begin(), all.end());
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, all) << "not every sample of the plan arrived exactly once";

  const auto per = m.completed_per_daemon();
  EXPECT_EQ(per.at(0), 1u) << "the draining daemon's batch did not arrive from it";
  EXPECT_EQ(per.at(1), batches.size() - 1);
  EXPECT_GE(m.leases_reissued(), 1u);  // batch 2, refused
  EXPECT_EQ(m.live_daemons(), 1u);
  const auto status = d1.wait_exit(10s);
  ASSERT_TRUE(status.has_value()) << "the drained daemon did not exit";
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  // The refusals did not bounce: one for batch 2, at most a few in flight.
  const std::string text = read_text(err);
  const std::string said = "drained: 1 batches sent since SIGTERM, ";
  const auto at = text.find(said);
  ASSERT_NE(at, std::string::npos) << text;
  std::size_t digits = 0;
  const int refused = std::stoi(text.substr(at + said.size()), &digits);
  EXPECT_EQ(text.compare(at + said.size() + digits, 15, " leases refused"), 0) << text;
  EXPECT_LE(refused, 3) << text;
}

// ERROR(kBusy) is the draining daemon's refusal, and also a daemon's at its
// --max-leases: either way the LeaseManager gives it no new lease until it
// answers otherwise, instead of handing the refused batch straight back to it
// (a round trip each, for as long as its batch takes).
TEST_F(DaemonDrainTest, BusyRefusalsPauseTheDaemonInsteadOfBouncing) {
  constexpr std::uint64_t kEpoch = 1;
  const EpochPlan plan{kSamples, kBatch, kSeed, true, false, 0, 1};
  const auto batches = plan.batches(kEpoch);
  const std::uint64_t fifo = batches[0][0] != 0 ? batches[0][0] : batches[0][1];
  write_images(dir_.path(), fifo);
  DaemonProcess d(1, {"--metrics-port", "0", "--max-leases", "1"});
  LeaseOptions o;
  o.config = {(dir_.path() / "train").string(), kSpec, kSeed, kBatch};
  o.token = test::kToken;
  o.per_daemon = 2;  // one more than the daemon takes
  o.connect_timeout = 30s;
  LeaseManager m(o);
  m.add_daemon("127.0.0.1", d.port());
  m.set_epoch(kEpoch);
  double refused_while_held = -1;
  std::thread hold([&] {
    EXPECT_TRUE(wait_metrics(d.metrics_port(), [](const auto& v) {
      return v.at("dlop_offloader_batches_in_progress") == 1 && v.at("dlop_offloader_batches_failed_total") >= 1;
    }));
    std::this_thread::sleep_for(300ms);  // batch 0 is held: a bouncing lease would be refused again and again
    refused_while_held = metric(d.metrics_port(), "dlop_offloader_batches_failed_total");
    release(fifo_path(dir_.path(), fifo));
  });
  std::size_t n = 0;
  while (auto batch = m.next()) {
    EXPECT_EQ(batch->indices, batches.at(n++));
    m.release(batch->slot);
  }
  hold.join();
  EXPECT_EQ(n, batches.size());
  EXPECT_EQ(refused_while_held, 1) << "the refused lease bounced while the daemon's one lease was held";
  // At most one refusal per batch made.
  EXPECT_LE(metric(d.metrics_port(), "dlop_offloader_batches_failed_total"), static_cast<double>(batches.size()));
}

}  // namespace
}  // namespace dlop::offload
