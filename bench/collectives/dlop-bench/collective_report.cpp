#include "collective_report.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "collectives/reduce.hpp"
#include "core/error.hpp"
#include "format.hpp"

extern char** environ;

namespace dlop::bench {
namespace {

using coll::CollKind;

constexpr std::size_t kLatencyRatioUpTo = 4096;  // the time ratio column, for latency-bound sizes

// leader, size, count, type, redop, root, place | dlop time, algbw, busbw, wrong | MPI time, busbw, wrong |
// ratios busbw, time | %ceil
constexpr const char* kLine =
    "{}{:>11} {:>11} {:>8} {:>6} {:>4} {:>5} | {:>10} {:>7} {:>7} {:>6} | {:>10} {:>7} {:>6} | {:>6} {:>6} | {:>5}\n";

std::string fixed(double v, int digits = 2) { return fmt::format("{:.{}f}", v, digits); }

std::string wrong_text(const ImplResult& r) {
  if (!r.error.empty()) return "err";
  if (!r.ran) return "-";
  return r.wrong < 0 ? "-" : std::to_string(r.wrong);
}

// What chose the transports: DLOP_*, UCX_*, and Open MPI's component choices
// (mpirun --mca pml/btl/coll/mtl/osc ... arrive as OMPI_MCA_* variables).
nlohmann::json mca_environment() {
  nlohmann::json mca = nlohmann::json::object();
  const auto starts = [](const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; };
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const bool mpi = starts(entry, "OMPI_MCA_pml") || starts(entry, "OMPI_MCA_btl") || starts(entry, "OMPI_MCA_coll") ||
                     starts(entry, "OMPI_MCA_mtl") || starts(entry, "OMPI_MCA_osc");
    if (!mpi && !starts(entry, "UCX_") && !starts(entry, "DLOP_")) continue;
    const auto eq = entry.find('=');
    mca[entry.substr(0, eq)] = eq == std::string::npos ? "" : entry.substr(eq + 1);
  }
  return mca;
}

}  // namespace

Report::Report(ReportSetup setup) : s_(std::move(setup)) {}

double Report::ceiling_busbw() const {
  if (s_.options.kind != CollKind::kAllreduce || s_.ranks != 2 || !s_.membw.measured()) return 0;
  return allreduce_ceiling_busbw(s_.membw);
}

void Report::header() const {
  const CollectiveOptions& o = s_.options;
  fmt::print("# {}\n", o.command_line);
  std::string what = o.kind == CollKind::kBarrier ? "" : fmt::format(", {}", coll::dtype_name(o.dtype));
  if (reduces(o.kind)) what += fmt::format(" {}", coll::op_name(o.op));
  if (rooted(o.kind)) what += fmt::format(", root {}", o.root);
  fmt::print("# dlop-bench {}: {} ranks on {} host(s){}; dlop's reduction kernels: {}\n", coll::kind_name(o.kind),
             s_.ranks, s_.hosts, what, coll::reduce_isa());
  fmt::print("# MPI columns: {}\n", s_.mpi ? *s_.mpi + ", " + s_.mpi_note : "absent (" + s_.mpi_note + ")");
  fmt::print("# time: per call, median of {} repetitions, each the slowest rank's mean over {} calls; warm-up {}{}\n",
             o.repetitions, o.iterations > 0 ? std::to_string(o.iterations) : "N = 32 MiB / S in [3, 1000]",
             o.warmup >= 0 ? std::to_string(o.warmup) + " calls"
                            : "max(N, 1 MiB / S) calls (at most 100k) for S <= 8 MiB, else 1",
             s_.mpi ? "; dlop and MPI alternate repetitions" : "");
  fmt::print("# buffers: {}; algbw = S / time, busbw = algbw x {} (nccl-tests)\n",
             o.rotate_bytes > 0 ? fmt::format("rotate through 64 MiB for S <= {}", format_size(o.rotate_bytes))
                                : std::string("one set, reused"),
             o.kind == CollKind::kAllreduce   ? "2(n-1)/n"
             : o.kind == CollKind::kBroadcast || o.kind == CollKind::kReduce ? "1"
                                                                                    : "(n-1)/n, S the full array");
  if (s_.membw.measured()) {
    fmt::print("# memory (rank 0, one core, 256 MiB arrays, median of 5): memcpy {:.2f} GB/s copied; a[i]+=b[i] on "
               "floats {:.2f} GB/s of a (3x that in traffic)\n",
               s_.membw.copy_gbps, s_.membw.add_gbps);
  }
  if (ceiling_busbw() > 0) {
    fmt::print("# %ceil = dlop busbw / {:.2f} GB/s, the 2-rank shared-memory all-reduce ceiling: each rank moves >= "
               "{} S bytes of memory traffic, at 2 x copy rate (read + write) = {:.2f} GB/s\n",
               ceiling_busbw(), kAllreduceTrafficPerByte, 2 * s_.membw.copy_gbps);
  }
  fmt::print("# ratios: busbw dlop/MPI (> 1: dlop faster); time dlop/MPI (< 1: dlop faster) for S <= 4K\n#\n");
  fmt::print(kLine, "#", "size", "count", "type", "redop", "root", "place", "dlop time", "algbw", "busbw", "#wrong",
             "MPI time", "busbw", "#wrong", "busbw", "time", "%ceil");
  fmt::print(kLine, "#", "(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "",
             "d/MPI", "d/MPI", "");
  std::fflush(stdout);
}

void Report::row(const RowResult& r) {
  rows_.push_back(r);
  const CollectiveOptions& o = s_.options;
  const bool barrier = o.kind == CollKind::kBarrier;
  const auto time = [](const ImplResult& x) { return x.ran ? fixed(x.time_us) : std::string("-"); };
  const auto bw = [&](const ImplResult& x, double v) { return x.ran && !barrier ? fixed(v) : std::string("-"); };
  const bool both = r.dlop.ran && r.mpi.ran;
  const std::string bw_ratio = both && !barrier && r.mpi.busbw_gbps > 0 ? fixed(r.dlop.busbw_gbps / r.mpi.busbw_gbps) : "-";
  const std::string time_ratio =
      both && r.layout.bytes <= kLatencyRatioUpTo && r.mpi.time_us > 0 ? fixed(r.dlop.time_us / r.mpi.time_us) : "-";
  const std::string ceil = r.dlop.ran && ceiling_busbw() > 0 ? fixed(100 * r.dlop.busbw_gbps / ceiling_busbw(), 0) : "-";
  fmt::print(kLine, " ", r.layout.bytes, r.layout.count, barrier ? "-" : std::string(coll::dtype_name(o.dtype)),
             reduces(o.kind) ? std::string(coll::op_name(o.op)) : "-", rooted(o.kind) ? std::to_string(o.root) : "-",
             r.in_place ? "in" : "out", time(r.dlop), bw(r.dlop, r.dlop.algbw_gbps), bw(r.dlop, r.dlop.busbw_gbps),
             wrong_text(r.dlop), time(r.mpi), bw(r.mpi, r.mpi.busbw_gbps), wrong_text(r.mpi), bw_ratio, time_ratio,
             ceil);
  const ImplResult* impls[2] = {&r.dlop, &r.mpi};
  for (int i = 0; i < 2; ++i) {
    if (!impls[i]->error.empty() && impls[i]->error != last_error_[i]) {
      fmt::print("#   {} failed: {}\n", i == 0 ? "dlop" : "MPI", impls[i]->error);
    }
    if (!impls[i]->error.empty()) last_error_[i] = impls[i]->error;
  }
  std::fflush(stdout);
}

void Report::footer(const std::vector<RankMemory>& memory) {
  memory_ = memory;
  double sum[2] = {0, 0};
  int rows[2] = {0, 0};
  std::int64_t wrong[2] = {0, 0};
  int checked[2] = {0, 0};
  for (const RowResult& r : rows_) {
    const ImplResult* impls[2] = {&r.dlop, &r.mpi};
    for (int i = 0; i < 2; ++i) {
      if (!impls[i]->ran) continue;
      sum[i] += impls[i]->busbw_gbps;
      ++rows[i];
      wrong[i] += std::max<std::int64_t>(impls[i]->wrong, 0);
      checked[i] += impls[i]->wrong >= 0 ? 1 : 0;
    }
  }
  const auto bounds = [&](int i) {
    if (checked[i] == 0) return std::string("- (not checked)");
    return fmt::format("{} {}", wrong[i], wrong[i] == 0 ? "OK" : "WRONG");
  };
  fmt::print("# Out of bounds values : dlop {}, MPI {}\n", bounds(0), s_.mpi ? bounds(1) : "-");
  fmt::print("# Peak RSS per rank (getrusage ru_maxrss) and what is left without the bench's own buffers "
             "(dlop, UCX{}, the process){}:\n", s_.mpi ? ", the MPI library and its scratch" : "",
             s_.mpi ? "; --mpi 0 shows dlop's alone" : "");
  for (std::size_t rank = 0; rank < memory.size(); ++rank) {
    const RankMemory& m = memory[rank];
    fmt::print("#   rank {}: peak {:.1f} MiB - buffers {:.1f} MiB = {:.1f} MiB\n", rank, m.peak_rss_mib, m.buffers_mib,
               m.peak_rss_mib - m.buffers_mib);
  }
  const auto avg = [&](int i) {
    return rows[i] > 0 ? fmt::format("{:.3f} GB/s over {} rows", sum[i] / rows[i], rows[i]) : std::string("-");
  };
  if (s_.options.kind == CollKind::kBarrier) {
    fmt::print("# Avg bus bandwidth    : - (a barrier moves no data)\n");
  } else {
    fmt::print("# Avg bus bandwidth    : dlop {}, MPI {}\n", avg(0), avg(1));
  }
  std::fflush(stdout);
}

void Report::write_json(const std::string& path) const {
  const CollectiveOptions& o = s_.options;
  nlohmann::json header = {
      {"benchmark", "collective"},       {"command", o.command_line},
      {"op", coll::kind_name(o.kind)},   {"dtype", coll::dtype_name(o.dtype)},
      {"redop", coll::op_name(o.op)},    {"root", o.root},
      {"ranks", s_.ranks},               {"hosts", s_.hosts},
      {"repetitions", o.repetitions},    {"iterations", o.iterations},
      {"warmup", o.warmup},              {"rotate_bytes", o.rotate_bytes},
      {"reduce_isa", coll::reduce_isa()}, {"mpi", s_.mpi ? nlohmann::json(*s_.mpi) : nlohmann::json(nullptr)},
      {"mpi_note", s_.mpi_note},         {"environment", mca_environment()},
  };
  if (s_.membw.measured()) {
    header["memory"] = {{"copy_gbps", s_.membw.copy_gbps},
                        {"add_gbps", s_.membw.add_gbps},
                        {"allreduce_ceiling_busbw_gbps", 2 * s_.membw.copy_gbps / kAllreduceTrafficPerByte},
                        {"ceiling_definition", "2-rank shared-memory all-reduce: 3.5 S bytes of traffic per rank at "
                                               "2 x copy_gbps (read + write); busbw == algbw for 2 ranks"}};
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const RowResult& r : rows_) {
    const std::pair<const char*, const ImplResult*> impls[2] = {{"dlop", &r.dlop}, {"mpi", &r.mpi}};
    for (const auto& [name, x] : impls) {
      if (!x->ran && x->error.empty()) continue;
      nlohmann::json row = {{"op", coll::kind_name(o.kind)}, {"bytes", r.layout.bytes}, {"count", r.layout.count},
                            {"dtype", coll::dtype_name(o.dtype)}, {"ranks", s_.ranks}, {"impl", name},
                            {"inplace", r.in_place}};
      row["time_us"] = x->ran ? nlohmann::json(x->time_us) : nlohmann::json(nullptr);
      row["algbw_gbps"] = x->ran ? nlohmann::json(x->algbw_gbps) : nlohmann::json(nullptr);
      row["busbw_gbps"] = x->ran ? nlohmann::json(x->busbw_gbps) : nlohmann::json(nullptr);
      row["wrong"] = x->wrong >= 0 ? nlohmann::json(x->wrong) : nlohmann::json(nullptr);
      if (!x->error.empty()) row["error"] = x->error;
      rows.push_back(std::move(row));
    }
  }
  nlohmann::json memory = nlohmann::json::array();
  for (const RankMemory& m : memory_) {
    memory.push_back({{"peak_rss_mib", m.peak_rss_mib}, {"buffers_mib", m.buffers_mib},
                      {"beyond_buffers_mib", m.peak_rss_mib - m.buffers_mib}});
  }
  std::ofstream out(path);
  out << nlohmann::json{{"header", header}, {"rows", rows}, {"memory", memory}}.dump(2) << "\n";
  if (!out) throw_errno(fmt::format("cannot write {}", path));
}

}  // namespace dlop::bench
