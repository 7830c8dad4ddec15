#include "exchange.hpp"

#include <fmt/format.h>

#include <chrono>
#include <thread>
#include <vector>

#include "format.hpp"
#include "transport/mesh.hpp"

namespace dlop::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr transport::Tag kExchangeTag = 10;

std::uint8_t pattern(int src, int dst, std::size_t i) {
  return static_cast<std::uint8_t>(i * 13 + static_cast<std::size_t>(src) * 31 + static_cast<std::size_t>(dst));
}

}  // namespace

int run_exchange(transport::Bootstrap& bootstrap, const ExchangeOptions& options) {
  transport::UcxWorker worker;
  transport::Mesh::Options mesh_options;
  // Spinning ranks starve each other once they outnumber the cores.
  mesh_options.progress =
      static_cast<unsigned>(bootstrap.size()) > std::thread::hardware_concurrency() ? ProgressMode::kAuto : ProgressMode::kSpin;
  transport::Mesh mesh(worker, bootstrap, mesh_options);
  const int n = mesh.size();
  const int me = mesh.rank();
  const std::size_t peers = static_cast<std::size_t>(n);
  std::vector<std::vector<std::uint8_t>> out(peers), in(peers);
  for (int p = 0; p < n; ++p) {
    out[static_cast<std::size_t>(p)].resize(options.max_bytes);
    in[static_cast<std::size_t>(p)].resize(options.max_bytes);
    for (std::size_t i = 0; i < options.max_bytes; ++i) out[static_cast<std::size_t>(p)][i] = pattern(me, p, i);
  }
  if (me == 0) {
    fmt::print("# dlop-bench exchange: {} ranks, each sends one message to every other, median of {}\n", n,
               options.repetitions);
    fmt::print("# {:>10} {:>12} {:>22} {:>8}\n", "size", "time(us)", "per-rank send(GB/s)", "wrong");
  }
  int all_wrong = 0;
  std::vector<transport::Request> requests;
  for (const std::size_t bytes : size_range(options.min_bytes, options.max_bytes, options.factor)) {
    std::vector<double> samples;
    for (int rep = -1; rep < options.repetitions; ++rep) {
      requests.clear();
      const auto start = Clock::now();
      for (int shift = 1; shift < n; ++shift) {  // pairwise order spreads the load
        const int to = (me + shift) % n, from = (me - shift + n) % n;
        requests.push_back(mesh.recv(from, in[static_cast<std::size_t>(from)].data(), bytes, kExchangeTag));
        requests.push_back(mesh.send(to, out[static_cast<std::size_t>(to)].data(), bytes, kExchangeTag));
      }
      for (auto& r : requests) r.wait();
      if (rep >= 0) samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
    int wrong = 0;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      for (std::size_t i = 0; i < bytes; ++i) wrong += in[static_cast<std::size_t>(p)][i] != pattern(p, me, i);
    }
    all_wrong += wrong;
    const double us = median(samples);
    if (me == 0) {
      fmt::print("  {:>10} {:>12.2f} {:>22.3f} {:>8}\n", format_size(bytes), us,
                 static_cast<double>(bytes) * (n - 1) / us / 1e3, wrong);
      std::fflush(stdout);
    }
  }
  mesh.fence(mesh.options().timeout);
  return all_wrong == 0 ? 0 : 1;
}

}  // namespace dlop::bench
