#include "p2p.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.hpp"
#include "format.hpp"
#include "transport/mesh.hpp"

namespace dlop::bench {
namespace {

using Clock = std::chrono::steady_clock;
using transport::Mesh;
using transport::Request;

constexpr transport::Tag kPingTag = 1;
constexpr transport::Tag kStreamTag = 2;
constexpr transport::Tag kAckTag = 3;

// Enough round trips per repetition to take a few milliseconds at any size.
int iterations_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((32u << 20) / std::max<std::size_t>(bytes, 1), 2, 1000));
}
// Messages in flight per bandwidth window (ucx_perftest keeps a window too).
int window_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((64u << 20) / std::max<std::size_t>(bytes, 1), 2, 64));
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Row {
  std::size_t bytes = 0;
  double latency_us = 0;
  double bandwidth_gbps = 0;
  bool intact = true;
};

class PingPong {
 public:
  PingPong(Mesh& mesh, std::size_t max_bytes, int repetitions)
      : mesh_(mesh), peer_(1 - mesh.rank()), repetitions_(repetitions), out_(max_bytes), in_(max_bytes) {
    for (std::size_t i = 0; i < out_.size(); ++i) out_[i] = static_cast<std::uint8_t>(i * 7 + 1);
  }

  Row measure(std::size_t bytes) {
    Row row{bytes, latency(bytes), bandwidth(bytes), true};
    // Contents arrived intact? (compared outside the timed loops)
    row.intact = std::equal(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(bytes), out_.begin());
    return row;
  }

 private:
  // Half the round trip, as ucx_perftest's tag_lat reports it.
  double latency(std::size_t bytes) {
    const int iterations = iterations_for(bytes);
    std::vector<double> samples;
    for (int rep = -1; rep < repetitions_; ++rep) {  // rep -1 warms up
      const auto start = Clock::now();
      for (int i = 0; i < iterations; ++i) {
        if (mesh_.rank() == 0) {
          mesh_.send(peer_, out_.data(), bytes, kPingTag).wait();
          mesh_.recv(peer_, in_.data(), bytes, kPingTag).wait();
        } else {
          mesh_.recv(peer_, in_.data(), bytes, kPingTag).wait();
          mesh_.send(peer_, out_.data(), bytes, kPingTag).wait();
        }
      }
      if (rep >= 0) samples.push_back(seconds_since(start) * 1e6 / iterations / 2);
    }
    return median(samples);
  }

  // Rank 0 streams a window of messages, rank 1 acknowledges the window.
  double bandwidth(std::size_t bytes) {
    const int window = window_for(bytes);
    std::vector<double> samples;
    std::vector<Request> requests(static_cast<std::size_t>(window));
    for (int rep = -1; rep < repetitions_; ++rep) {
      const auto start = Clock::now();
      if (mesh_.rank() == 0) {
        for (auto& r : requests) r = mesh_.send(peer_, out_.data(), bytes, kStreamTag);
        for (auto& r : requests) r.wait();
        mesh_.recv(peer_, nullptr, 0, kAckTag).wait();
      } else {
        for (auto& r : requests) r = mesh_.recv(peer_, in_.data(), bytes, kStreamTag);
        for (auto& r : requests) r.wait();
        mesh_.send(peer_, nullptr, 0, kAckTag).wait();
      }
      if (rep >= 0) samples.push_back(static_cast<double>(bytes) * window / seconds_since(start) / 1e9);
    }
    return median(samples);
  }

  Mesh& mesh_;
  int peer_;
  int repetitions_;
  std::vector<std::uint8_t> out_;
  std::vector<std::uint8_t> in_;
};

void write_json(const std::string& path, const std::vector<Row>& rows, const char* tls) {
  nlohmann::json doc;
  doc["benchmark"] = "p2p";
  doc["ranks"] = 2;
  doc["ucx_tls"] = tls;
  doc["rows"] = nlohmann::json::array();
  for (const Row& row : rows) {
    doc["rows"].push_back({{"bytes", row.bytes}, {"latency_us", row.latency_us}, {"bandwidth_gbps", row.bandwidth_gbps}});
  }
  std::ofstream out(path);
  out << doc.dump(2) << "\n";
  if (!out) throw_errno(fmt::format("cannot write {}", path));
}

}  // namespace

int run_p2p(transport::Bootstrap& bootstrap, const P2pOptions& options) {
  if (bootstrap.size() != 2) {
    throw_error(Errc::kInvalidArgument, fmt::format("p2p runs on exactly 2 ranks, not {}", bootstrap.size()));
  }
  transport::UcxWorker worker;
  Mesh::Options mesh_options;
  mesh_options.progress = options.progress;
  Mesh mesh(worker, bootstrap, mesh_options);
  PingPong bench(mesh, options.max_bytes, options.repetitions);
  const char* tls = std::getenv("UCX_TLS") != nullptr ? std::getenv("UCX_TLS") : "default";
  if (mesh.rank() == 0) {
    fmt::print("# dlop-bench p2p: 2 ranks ({}), UCX_TLS={}, median of {} repetitions\n",
               mesh.is_local(1) ? "one host" : "two hosts", tls, options.repetitions);
    fmt::print("# {:>10} {:>14} {:>17} {:>8}\n", "size", "latency(us)", "bandwidth(GB/s)", "check");
  }
  std::vector<Row> rows;
  bool all_intact = true;
  for (const std::size_t bytes : size_range(options.min_bytes, options.max_bytes, options.factor)) {
    Row row = bench.measure(bytes);
    all_intact = all_intact && row.intact;
    if (mesh.rank() == 0) {
      fmt::print("  {:>10} {:>14.2f} {:>17.3f} {:>8}\n", format_size(bytes), row.latency_us, row.bandwidth_gbps,
                 row.intact ? "ok" : "WRONG");
      std::fflush(stdout);
    }
    rows.push_back(row);
  }
  if (mesh.rank() == 0 && !options.json.empty()) write_json(options.json, rows, tls);
  mesh.fence(mesh.options().timeout);
  return all_intact ? 0 : 1;
}

}  // namespace dlop::bench
