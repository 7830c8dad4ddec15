// DLOP_TRACE through the engine: two ranks each write one Chrome trace file
// at engine teardown, with every collective (op, bytes, class, algorithm,
// chunk count, time queued before it started) and one event per chunk of a
// chunked (data) all-reduce, in order, inside the op's span. tests/python/test_trace.py checks the same through
// torch.distributed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/multiprocess.hpp"
#include "scheduler/communicator.hpp"

namespace dlop::sched {
namespace {

using coll::DataType;
using coll::ReduceOp;
using nlohmann::json;

constexpr std::size_t kChunkBytes = 64u << 10;
constexpr std::size_t kLarge = 100'003;  // floats: 400,012 B, 7 chunks
constexpr int kGateMs = 30;

// Ready from a given time on, as a device copy is once its stream gets there.
class ReadyAfter final : public ReadyEvent {
 public:
  explicit ReadyAfter(std::chrono::milliseconds delay) : at_(std::chrono::steady_clock::now() + delay) {}
  bool ready() const override { return std::chrono::steady_clock::now() >= at_; }
  std::string describe() const override { return "the test's clock"; }

 private:
  std::chrono::steady_clock::time_point at_;
};

std::vector<json> named(const json& events, const std::string& name) {
  std::vector<json> out;
  for (const auto& e : events) {
    if (e["name"] == name) out.push_back(e);
  }
  return out;
}

TEST(Communicator, TraceWritesOneChromeTraceFilePerRank) {
  const std::string dir = test::make_temp_dir();
  test::run_ranks(2, [&](transport::Bootstrap& b) {
    ::setenv("DLOP_TRACE", dir.c_str(), 1);  // before anything reads the configuration here
    auto comm = Communicator::create(b, {.traffic_classes = true, .chunk_bytes = kChunkBytes});
    std::vector<float> large(kLarge, 1.0f);
    std::vector<float> small(10, 1.0f);
    comm->allreduce(large.data(), large.data(), large.size(), DataType::kFloat32, ReduceOp::kSum,
                    {.traffic = TrafficClass::kData, .deadline_step = 3})
        .wait();
    // Gated as a staged device call is: its span starts when it starts, and
    // says how long it was queued.
    comm->allreduce(small.data(), small.data(), small.size(), DataType::kFloat32, ReduceOp::kSum,
                    {.ready = std::make_shared<ReadyAfter>(std::chrono::milliseconds(kGateMs))})
        .wait();
    // A gradient op as large is not chunked: nothing can overtake it.
    comm->allreduce(large.data(), large.data(), large.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    comm->broadcast(small.data(), small.size(), DataType::kFloat32, 0, {.traffic = TrafficClass::kBackground}).wait();
    ASSERT_EQ(large.back(), 4.0f);
    comm.reset();  // the engine's teardown writes the file
  });
  std::set<std::int64_t> pids;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++files;
    const std::string name = entry.path().filename().string();
    ASSERT_EQ(name.rfind("dlop-trace-", 0), 0u) << name;
    const json doc = json::parse(std::ifstream(entry.path()));
    const json& events = doc.at("traceEvents");
    ASSERT_FALSE(events.empty()) << name;
    const std::int64_t pid = events[0]["pid"];
    pids.insert(pid);
    EXPECT_NE(name.find("-" + std::to_string(pid) + ".json"), std::string::npos) << name;
    for (const auto& e : events) {
      EXPECT_EQ(e["ph"], "X");
      EXPECT_EQ(e["pid"], pid);
      EXPECT_GE(e["dur"].get<std::int64_t>(), 0);
    }
    auto allreduces = named(events, "allreduce");
    ASSERT_EQ(allreduces.size(), 3u) << events.dump();
    std::sort(allreduces.begin(), allreduces.end(), [](const json& a, const json& b) { return a["ts"] < b["ts"]; });
    const json& big = allreduces[0];  // submission order
    const json& small = allreduces[1];
    const json& gradient = allreduces[2];
    EXPECT_EQ(big["args"]["bytes"], kLarge * 4);
    EXPECT_EQ(big["args"]["class"], "data");
    EXPECT_EQ(big["cat"], "data");
    EXPECT_EQ(big["args"]["chunks"], 7);
    EXPECT_EQ(big["args"]["status"], "done");
    EXPECT_EQ(big["args"]["dtype"], "float");
    EXPECT_FALSE(big["args"]["algorithm"].get<std::string>().empty());
    EXPECT_EQ(small["args"]["class"], "gradient");
    EXPECT_EQ(small["args"]["chunks"], 1);
    EXPECT_EQ(small["args"]["bytes"], 40);
    EXPECT_GE(small["args"]["queued_us"].get<std::int64_t>(), kGateMs * 1000 - 1000);
    EXPECT_GE(big["args"]["queued_us"].get<std::int64_t>(), 0);
    EXPECT_EQ(gradient["args"]["bytes"], kLarge * 4);
    EXPECT_EQ(gradient["args"]["class"], "gradient");
    EXPECT_EQ(gradient["args"]["chunks"], 1);
    const auto broadcasts = named(events, "broadcast");
    ASSERT_EQ(broadcasts.size(), 1u);
    EXPECT_EQ(broadcasts[0]["args"]["class"], "background");
    // The chunks: 0..6 in order, one after another, inside the op's span.
    auto chunks = named(events, "allreduce chunk");
    ASSERT_EQ(chunks.size(), 7u);
    std::sort(chunks.begin(), chunks.end(), [](const json& a, const json& b) { return a["ts"] < b["ts"]; });
    const std::int64_t op_start = big["ts"], op_end = op_start + big["dur"].get<std::int64_t>();
    std::int64_t bytes = 0;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const json& c = chunks[i];
      EXPECT_EQ(c["args"]["chunk"], i);
      EXPECT_EQ(c["args"]["seq"], big["args"]["seq"].get<std::int64_t>() + static_cast<std::int64_t>(i));
      EXPECT_LE(c["args"]["bytes"].get<std::size_t>(), kChunkBytes);
      bytes += c["args"]["bytes"].get<std::int64_t>();
      const std::int64_t start = c["ts"], end = start + c["dur"].get<std::int64_t>();
      EXPECT_LE(op_start, start);
      EXPECT_LE(end, op_end + 1);
      if (i > 0) {
        EXPECT_LE(chunks[i - 1]["ts"].get<std::int64_t>() + chunks[i - 1]["dur"].get<std::int64_t>(), start + 1);
      }
    }
    EXPECT_EQ(bytes, static_cast<std::int64_t>(kLarge * 4));
  }
  EXPECT_EQ(files, 2);
  EXPECT_EQ(pids.size(), 2u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlop::sched
