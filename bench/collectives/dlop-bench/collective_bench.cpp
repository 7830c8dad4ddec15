#include "collective_bench.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "buffers.hpp"
#include "check.hpp"
#include "coll_case.hpp"
#include "collective_report.hpp"
#include "core/config.hpp"
#include "core/config_features.hpp"
#include "core/error.hpp"
#include "format.hpp"
#include "membw.hpp"
#include "scheduler/communicator.hpp"
#if DLOP_HAVE_MPI
#include "mpi_reference.hpp"
#include "transport/mpi_bootstrap.hpp"
#endif

namespace dlop::bench {
namespace {

using Clock = std::chrono::steady_clock;
using coll::CollKind;

constexpr std::size_t kAutoIterBytes = std::size_t{32} << 20;  // auto iterations: this much per repetition
// Auto warm-up: at least this much, up to 100k calls. A few microseconds'
// worth of calls left the first row of a sweep slower than the same size
// measured second (8 B: 1.06x MPI first, 0.88x second), for both libraries.
constexpr std::size_t kAutoWarmupBytes = std::size_t{1} << 20;
constexpr std::size_t kMaxWarmupCalls = 100'000;

class DlopRunner : public Runner {
 public:
  explicit DlopRunner(transport::Bootstrap& bootstrap) : bootstrap_(bootstrap) { reset(); }
  // A failed collective breaks its communicator: start a new one (collective).
  void reset() {
    comm_.reset();
    comm_ = sched::Communicator::create(bootstrap_);
  }
  int hosts() const { return comm_->hosts(); }

  void run(const Call& c) override {
    const sched::OpOptions now{.caller_waits = true};
    switch (c.kind) {
      case CollKind::kAllreduce: return comm_->allreduce(c.send, c.recv, c.count, c.dtype, c.op, now).wait();
      case CollKind::kBroadcast: return comm_->broadcast(c.recv, c.count, c.dtype, c.root, now).wait();
      case CollKind::kReduce: return comm_->reduce(c.send, c.recv, c.count, c.dtype, c.op, c.root, now).wait();
      case CollKind::kAllgather: return comm_->allgather(c.send, c.recv, c.count, c.dtype, now).wait();
      case CollKind::kReduceScatter:
        return comm_->reduce_scatter(c.send, c.recv, c.count, c.dtype, c.op, now).wait();
      case CollKind::kAlltoall: return comm_->alltoall(c.send, c.recv, c.count, c.dtype, now).wait();
      case CollKind::kBarrier: return comm_->barrier(now).wait();
      default: throw_error(Errc::kInvalidArgument, fmt::format("no benchmark for {}", coll::kind_name(c.kind)));
    }
  }

 private:
  transport::Bootstrap& bootstrap_;
  std::shared_ptr<sched::Communicator> comm_;
};

// One implementation's view of a row on this rank.
struct LocalRun {
  Runner* runner = nullptr;
  std::size_t next_slot = 0;  // rotation continues through warm-up and repetitions
  std::vector<double> us;     // per call, one per repetition
  std::string error;
  std::int64_t wrong = -1;

  bool active() const { return runner != nullptr && error.empty(); }
  nlohmann::json summary() const { return {{"us", us}, {"error", error}, {"wrong", wrong}}; }
  // Runs `calls` calls; returns the seconds they took, or -1 after a failure (kept in error).
  double run(int calls, const std::function<Call(std::size_t)>& call_at) {
    if (!active()) return -1;
    try {
      const auto start = Clock::now();
      for (int i = 0; i < calls; ++i) runner->run(call_at(next_slot++));
      return std::chrono::duration<double>(Clock::now() - start).count();
    } catch (const std::exception& e) {
      error = e.what();
      return -1;
    }
  }
};

// Combines every rank's LocalRun: slowest rank per repetition, median of those.
ImplResult combine(const std::vector<nlohmann::json>& ranks, const char* key, const CollLayout& l, bool attempted) {
  ImplResult out;
  if (!attempted) return out;
  std::vector<double> slowest;
  std::int64_t wrong = 0;
  bool checked = true;
  for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
    const auto& r = ranks[rank].at(key);
    const std::string error = r.at("error").get<std::string>();
    if (!error.empty() && out.error.empty()) out.error = fmt::format("rank {}: {}", rank, error);
    const auto us = r.at("us").get<std::vector<double>>();
    slowest.resize(std::max(slowest.size(), us.size()), 0.0);
    for (std::size_t i = 0; i < us.size(); ++i) slowest[i] = std::max(slowest[i], us[i]);
    const auto w = r.at("wrong").get<std::int64_t>();
    checked = checked && w >= 0;
    wrong += std::max<std::int64_t>(w, 0);
  }
  if (!out.error.empty() || slowest.empty()) return out;
  out.ran = true;
  out.time_us = median(slowest);
  out.algbw_gbps = out.time_us > 0 ? static_cast<double>(l.bytes) / out.time_us / 1e3 : 0;
  out.busbw_gbps = out.algbw_gbps * l.busbw_factor;
  out.wrong = checked ? wrong : -1;
  return out;
}

std::vector<nlohmann::json> allgather_json(transport::Bootstrap& b, const nlohmann::json& mine) {
  const std::string text = mine.dump();
  std::vector<nlohmann::json> all;
  for (const auto& bytes : b.allgather(transport::Bytes(text.begin(), text.end()), config().timeout)) {
    all.push_back(nlohmann::json::parse(std::string(bytes.begin(), bytes.end())));
  }
  return all;
}

struct Bench {
  transport::Bootstrap& boot;
  const CollectiveOptions& o;
  const Arena& arena;
  DlopRunner& dlop;
  Runner* mpi;

  RowResult measure(const CollLayout& l, bool in_place) {
    const int me = boot.rank();
    const SlotPlan plan = plan_slots(l, o.dtype, o.rotate_bytes);
    const Call proto{.dtype = o.dtype, .op = o.op, .root = o.root, .in_place = in_place};
    const auto call_at = [&](std::size_t slot) { return slot_call(arena, plan, slot, l, proto, me); };
    const int iters = o.iterations > 0 ? o.iterations
                                       : static_cast<int>(std::clamp<std::size_t>(
                                             kAutoIterBytes / std::max<std::size_t>(l.bytes, 1), 3, 1000));
    const auto warmup_calls = std::clamp<std::size_t>(kAutoWarmupBytes / std::max<std::size_t>(l.bytes, 1),
                                                      static_cast<std::size_t>(iters), kMaxWarmupCalls);
    const int warmup = o.warmup >= 0 ? o.warmup : l.bytes <= (std::size_t{8} << 20) ? static_cast<int>(warmup_calls) : 1;
    LocalRun runs[2] = {{.runner = &dlop}, {.runner = mpi}};
    for (LocalRun& r : runs) r.run(warmup, call_at);
    for (int rep = 0; rep < o.repetitions; ++rep) {
      for (int k = 0; k < 2; ++k) {
        LocalRun& r = runs[(rep + k) % 2];  // who goes first alternates, so drifts hit both
        boot.barrier(config().timeout);
        r.run(1, call_at);  // one untimed call lines the ranks up after the barrier
        const double s = r.run(iters, call_at);
        if (s >= 0) r.us.push_back(s * 1e6 / iters);
      }
    }
    if (o.check && l.kind != CollKind::kBarrier) {
      for (LocalRun& r : runs) {
        if (!r.active()) continue;
        const Call c = call_at(0);
        prepare_check(c, l, me, boot.size());
        if (r.run(1, [&](std::size_t) { return c; }) >= 0) {
          r.wrong = static_cast<std::int64_t>(count_wrong(c, l, me, boot.size()));
        }
      }
    }
    const auto all = allgather_json(boot, {{"dlop", runs[0].summary()}, {"mpi", runs[1].summary()}});
    RowResult row{.layout = l, .in_place = in_place, .dlop = combine(all, "dlop", l, true),
                  .mpi = combine(all, "mpi", l, mpi != nullptr)};
    if (!row.dlop.error.empty()) dlop.reset();  // every rank agrees: the error came through the allgather
    return row;
  }
};

double peak_rss_mib() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace

int run_collective(transport::Bootstrap& boot, const CollectiveOptions& o) {
  const int n = boot.size();
  if (reduces(o.kind)) coll::check_reduction(o.op, o.dtype);
  if (rooted(o.kind) && (o.root < 0 || o.root >= n)) {
    throw_error(Errc::kInvalidArgument, fmt::format("root {} is not a rank of {}", o.root, n));
  }
  std::vector<CollLayout> layouts;
  if (o.kind == CollKind::kBarrier) {
    layouts.push_back(make_layout(o.kind, 0, o.dtype, n));
  } else {
    std::vector<std::size_t> sizes = size_range(o.min_bytes, o.max_bytes, o.factor);
    if (o.min_bytes <= o.max_bytes && (sizes.empty() || sizes.back() < o.max_bytes)) {
      sizes.push_back(o.max_bytes);  // -e is always a row, whatever the factor
    }
    for (const std::size_t bytes : sizes) {
      const CollLayout l = make_layout(o.kind, bytes, o.dtype, n);
      if (l.count > 0) layouts.push_back(l);
    }
  }
  std::size_t arena_bytes = 0;
  for (const CollLayout& l : layouts) {
    arena_bytes = std::max(arena_bytes, plan_slots(l, o.dtype, o.rotate_bytes).arena_bytes());
  }
  const Arena arena(arena_bytes);

  MemoryBandwidth membw;
  if (o.membw && boot.rank() == 0) membw = measure_memory_bandwidth();
  boot.barrier(config().timeout);  // the others wait while rank 0 measures

  std::unique_ptr<Runner> mpi;
  ReportSetup setup{.options = o, .ranks = n};
#if DLOP_HAVE_MPI
  auto* mpi_boot = dynamic_cast<transport::MpiBootstrap*>(&boot);
  if (mpi_boot != nullptr && o.mpi) {
    mpi = std::make_unique<MpiReference>(mpi_boot->comm(), o.dtype, o.op);
    setup.mpi = MpiReference::library_version();
    setup.mpi_note = "its own collective, same buffers";
    const bool bits16 = o.dtype == coll::DataType::kFloat16 || o.dtype == coll::DataType::kBFloat16;
    if (bits16 && reduces(o.kind)) setup.mpi_note += "; MPI_UINT16_T with a user MPI_Op running dlop's kernels";
    if (o.op == coll::ReduceOp::kAvg && reduces(o.kind)) setup.mpi_note += "; avg = MPI_SUM, then / n in the call";
  } else {
    setup.mpi_note = mpi_boot == nullptr ? "not started by mpirun" : "--mpi 0";
  }
#else
  setup.mpi_note = "this dlop-bench was built without MPI";
#endif
  DlopRunner dlop(boot);
  setup.hosts = dlop.hosts();
  setup.membw = membw;
  std::optional<Report> report;
  if (boot.rank() == 0) {
    report.emplace(setup);
    report->header();
  }

  Bench bench{boot, o, arena, dlop, mpi.get()};
  bool all_right = true;
  for (const CollLayout& l : layouts) {
    for (const bool in_place : {false, true}) {
      // Broadcast and barrier have no out-of-place form: they run once, in place.
      const bool wanted = !has_out_of_place(o.kind) ? in_place : o.inplace == 2 || (o.inplace == 1) == in_place;
      if (!wanted) continue;
      const RowResult row = bench.measure(l, in_place);
      all_right = all_right && row.dlop.wrong <= 0 && row.mpi.wrong <= 0;
      if (report) report->row(row);
    }
  }

  std::vector<RankMemory> memory;
  const double buffers_mib = static_cast<double>(arena.bytes()) / (1 << 20);
  for (const auto& r : allgather_json(boot, {{"peak", peak_rss_mib()}, {"buffers", buffers_mib}})) {
    memory.push_back({r.at("peak").get<double>(), r.at("buffers").get<double>()});
  }
  if (report) {
    report->footer(memory);
    if (!o.json.empty()) report->write_json(o.json);
  }
  return all_right ? 0 : 1;
}

}  // namespace dlop::bench
